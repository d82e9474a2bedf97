from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ForwardBatch:
    """One decode step (``q_len`` tokens per request: 1 + the speculative tokens)."""

    batch_size: int
    q_len: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    req_pool_indices: torch.Tensor       # device
    req_pool_indices_cpu: torch.Tensor
    seq_lens: torch.Tensor               # device
    seq_lens_cpu: torch.Tensor
    out_cache_loc: torch.Tensor          # device; tokens another rank owns go to the trash page
    qo_indptr_cpu: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return self.batch_size * self.q_len
