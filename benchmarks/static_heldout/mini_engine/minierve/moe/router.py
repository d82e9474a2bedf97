import torch

from flashcheck import hot_path


class TopKRouter:
    def __init__(self, num_experts, top_k, device):
        self.num_experts = num_experts
        self.top_k = top_k
        self.device = device
        self.expert_load = None
        self.expert_load_cpu = torch.zeros(num_experts, dtype=torch.int64)

    def allocate(self):
        self.expert_load = torch.zeros(self.num_experts, dtype=torch.int64, device=self.device)

    @hot_path
    def route(self, router_logits):
        weights, topk_ids = torch.topk(torch.softmax(router_logits.float(), -1), self.top_k, dim=-1)
        self.expert_load += torch.bincount(topk_ids.flatten(), minlength=self.num_experts)
        active = torch.unique(topk_ids)  # expect: FC101
        if min(self.expert_load) == 0:  # expect: FC101
            weights = weights / weights.sum(-1, keepdim=True)
        if self.expert_load_cpu.sum() > 0:  # ok: FC101
            self.expert_load_cpu.zero_()
        return weights, topk_ids, active
