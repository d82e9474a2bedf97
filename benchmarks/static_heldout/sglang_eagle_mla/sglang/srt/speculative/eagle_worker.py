import logging

import torch

from sglang.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner
from sglang.srt.speculative.spec_info import EagleDraftInput, EagleVerifyOutput, verify_tree_greedy

logger = logging.getLogger(__name__)


class EAGLEWorker:
    def __init__(self, server_args, target_worker, draft_runner: EAGLEDraftCudaGraphRunner, device):
        self.server_args = server_args
        self.target_worker = target_worker
        self.draft_runner = draft_runner
        self.device = device
        self.num_draft_tokens = server_args.speculative_num_draft_tokens
        self.accept_length_buf = None
        self.spec_steps = 0

    def init_buffers(self, max_bs):
        self.accept_length_buf = torch.zeros(max_bs, dtype=torch.int32, device=self.device)
        for bs in self.draft_runner.capture_bs:
            self.draft_runner.record_graph(bs)
        torch.cuda.synchronize()  # ok: FC101

    def log_plan_stats(self, draft_input: EagleDraftInput):
        mean = draft_input.accept_length.float().mean().item()  # ok: FC101
        logger.info("eagle mean accept length %.2f after %d steps", mean, self.spec_steps)

    def verify(self, batch, candidates, target_predict):
        accept_index, accept_length = verify_tree_greedy(candidates, target_predict, self.num_draft_tokens, self.device)
        accept_index = accept_index[accept_index != -1]  # expect: FC101
        verified_id = target_predict.flatten()[accept_index]
        self.accept_length_buf[: accept_length.shape[0]].copy_(accept_length)
        accept_length_cpu = self.accept_length_buf[: accept_length.shape[0]].tolist()  # expect: FC101
        draft_input = EagleDraftInput(verified_id=verified_id, accept_length=accept_length, accept_length_cpu=accept_length_cpu)
        return EagleVerifyOutput(draft_input, verified_id, accept_length_cpu)

    def forward_batch_generation(self, batch):
        candidates, target_predict = self.target_worker.forward_target_verify(batch)
        res = self.verify(batch, candidates, target_predict)
        self.spec_steps += 1
        logger.debug("accepted %d tokens", float(res.draft_input.accept_length.sum()))  # expect: FC101
        num_accepted = sum(res.accept_length_per_req_cpu)  # ok: FC101
        bs = len(res.accept_length_per_req_cpu)
        padded = next(b for b in self.draft_runner.capture_bs if b >= bs)
        out = self.draft_runner.replay(padded, batch)
        return out, num_accepted
