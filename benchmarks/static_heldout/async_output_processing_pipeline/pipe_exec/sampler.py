"""Sampling on the device; results go to a pinned output slot for the post-processing thread."""

from typing import Tuple

import torch
from flashcheck import hot_path

from asyncpipe.config import PipelineConfig
from asyncpipe.pinned import OutputSlot


class Sampler:
    def __init__(self, cfg: PipelineConfig, device):
        self.cfg = cfg
        self.device = device
        self.k = cfg.top_logprobs
        self.sampled_ids = torch.empty(cfg.max_batch_size, dtype=torch.int64, device=device)

    @hot_path
    def sample(
        self, logits: torch.Tensor, temperatures: torch.Tensor, slot: OutputSlot, eos_id: int
    ) -> Tuple[torch.Tensor, int]:
        bs = logits.shape[0]
        if self.sampled_ids.numel() < bs:
            self.sampled_ids = torch.empty(bs, dtype=torch.int64, device=self.device)  # expect: FC107
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        greedy = logits.argmax(dim=-1)
        scaled = logits.float() / temperatures.clamp(min=1e-5)[:, None]
        gumbel = -torch.log(-torch.log(torch.rand_like(scaled).clamp_(min=1e-10)))
        sampled = (scaled + gumbel).argmax(dim=-1)
        next_ids = torch.where(temperatures > 0, sampled, greedy)
        self.sampled_ids[:bs].copy_(next_ids)
        chosen = logprobs.gather(1, next_ids[:, None]).squeeze(1)
        top = logprobs.topk(self.k, dim=-1)
        slot.tokens_pinned[:bs].copy_(next_ids, non_blocking=True)
        slot.logprobs_pinned[:bs].copy_(chosen, non_blocking=True)
        slot.top_ids_pinned[:bs].copy_(top.indices, non_blocking=True)
        slot.top_lp_pinned[:bs].copy_(top.values, non_blocking=True)
        slot.ready.record()
        # early hint for the scheduler: how many rows just produced eos
        n_eos = int(slot.tokens_pinned[:bs].eq(eos_id).sum())  # expect: FC101
        return self.sampled_ids[:bs], n_eos
