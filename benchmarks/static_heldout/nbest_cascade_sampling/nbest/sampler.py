"""Top-k / top-p sampling through flashinfer.sampling, captured together with the unique-suffix decode."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from flashinfer.sampling import top_k_top_p_sampling_from_probs

from nbest.config import NBestConfig


@dataclass
class SamplingBatch:
    num_seqs: int
    top_k_cpu: torch.Tensor
    inv_temperature_cpu: torch.Tensor
    top_p_cpu: Optional[torch.Tensor] = None  # None: no group asked for nucleus sampling this step


class FlashInferSampler:
    def __init__(self, cfg: NBestConfig, device: torch.device) -> None:
        max_bs = cfg.max_num_seqs
        self._backend = "flashinfer"
        self.vocab_size = cfg.vocab_size
        # persistent per-row parameters: the captured graphs read them in place
        self.top_k = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.top_p = torch.ones(max_bs, dtype=torch.float32, device=device)
        self.inv_temperature = torch.ones(max_bs, dtype=torch.float32, device=device)
        self.logprob_scratch: Optional[torch.Tensor] = None

    def load_params(self, params: SamplingBatch) -> None:
        bs = params.num_seqs
        self.top_k[:bs].copy_(params.top_k_cpu, non_blocking=True)
        self.inv_temperature[:bs].copy_(params.inv_temperature_cpu, non_blocking=True)
        if params.top_p_cpu is None:
            self.top_p = torch.full(self.top_p.shape, 1.0, dtype=torch.float32, device=self.top_p.device)  # expect: FC107
        else:
            self.top_p[:bs].copy_(params.top_p_cpu, non_blocking=True)

    def _scratch(self, logits: torch.Tensor) -> torch.Tensor:
        cur, rows = self.logprob_scratch, self.top_k.numel()
        self.logprob_scratch = torch.empty(rows, self.vocab_size, device=logits.device) if cur is None else cur  # ok: FC107
        return self.logprob_scratch

    def sample(self, logits: torch.Tensor, bs: int) -> Tuple[torch.Tensor, torch.Tensor]:
        logits = logits * self.inv_temperature[:bs, None]
        logprobs = self._scratch(logits)[:bs]
        torch.log_softmax(logits, dim=-1, out=logprobs)
        top_k = torch.where(self.top_k[:bs] > 0, self.top_k[:bs], self.vocab_size)  # ok: FC101
        ids = top_k_top_p_sampling_from_probs(logprobs.exp(), top_k, self.top_p[:bs], filter_apply_order="joint")
        return ids, logprobs.gather(1, ids.long()[:, None]).squeeze(1)
