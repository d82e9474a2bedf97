"""Per-step batch description handed to the backend and the model."""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch


@dataclasses.dataclass
class ForwardBatch:
    is_decode: bool
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    req_rows: torch.Tensor
    req_rows_cpu: torch.Tensor
    out_cache_loc: torch.Tensor
    qo_indptr: Optional[torch.Tensor] = None
    qo_indptr_cpu: Optional[torch.Tensor] = None
    max_seq_len_cpu: int = 0
    use_trtllm: bool = False

    @classmethod
    def dummy_decode(
        cls,
        bs: int,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        seq_lens: torch.Tensor,
        out_cache_loc: torch.Tensor,
    ) -> "ForwardBatch":
        return cls(
            is_decode=True,
            batch_size=bs,
            input_ids=input_ids,
            positions=positions,
            seq_lens=seq_lens,
            seq_lens_cpu=torch.ones(bs, dtype=torch.int32),
            req_rows=torch.zeros(bs, dtype=torch.int64, device=input_ids.device),
            req_rows_cpu=torch.zeros(bs, dtype=torch.int64),
            out_cache_loc=out_cache_loc,
            max_seq_len_cpu=1,
        )
