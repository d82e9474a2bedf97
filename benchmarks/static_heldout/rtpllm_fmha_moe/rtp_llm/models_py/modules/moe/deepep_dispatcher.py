import torch


class DeepEPDispatcher:
    def __init__(self, num_experts, ep_size, hidden_size, max_tokens, device):
        self.num_experts = num_experts
        self.ep_size = ep_size
        self.hidden_size = hidden_size
        self.max_tokens = max_tokens
        self.device = device
        self.expert_counts = torch.zeros(num_experts, dtype=torch.int32, device=device)
        self.expert_counts_host = torch.zeros(num_experts, dtype=torch.int32, pin_memory=True)
        self.recv_buffer = None
        self._warmup()

    def _warmup(self):
        probe = torch.bincount(torch.zeros(8, dtype=torch.int64, device=self.device), minlength=self.num_experts)
        torch.cuda.synchronize()  # ok: FC101
        return int(probe.sum())  # ok: FC101

    def _experts_per_rank(self):
        assert self.num_experts % self.ep_size == 0  # ok: FC109
        return self.num_experts // self.ep_size

    def _check_topk(self, topk_ids):
        assert topk_ids.dim() == 2, "topk_ids must be [tokens, k]"  # expect: FC109

    def dispatch(self, hidden_states, topk_ids, topk_weights):
        assert hidden_states.shape[0] <= self.max_tokens  # expect: FC109
        self._check_topk(topk_ids)
        self.expert_counts.copy_(torch.bincount(topk_ids.flatten(), minlength=self.num_experts))
        self.expert_counts_host.copy_(self.expert_counts)  # expect: FC101
        tokens_per_expert = self.expert_counts_host.tolist()  # ok: FC101
        num_recv_tokens = int(self.expert_counts.sum())  # expect: FC101
        self.recv_buffer = torch.empty(num_recv_tokens, self.hidden_size, dtype=hidden_states.dtype, device=self.device)  # expect: FC107
        per_rank = self._experts_per_rank()
        return self.recv_buffer, tokens_per_expert, per_rank
