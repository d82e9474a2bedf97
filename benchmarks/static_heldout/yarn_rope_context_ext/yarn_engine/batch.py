"""Decode batch of one RoPE band."""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
import torch


@dataclasses.dataclass
class Request:
    req_id: int
    row: int
    seq_len: int
    last_token: int
    out_loc: int


@dataclasses.dataclass
class DecodeBatch:
    band_index: int
    size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_np: np.ndarray
    rows_np: np.ndarray
    req_ids: torch.Tensor
    out_loc: torch.Tensor
    split_far: bool = False

    @classmethod
    def build(cls, reqs: Sequence[Request], band_index: int, far_split: int, device: torch.device) -> "DecodeBatch":
        lens_np = np.array([r.seq_len for r in reqs], dtype=np.int64)
        return cls(
            band_index=band_index,
            size=len(reqs),
            input_ids=torch.tensor([r.last_token for r in reqs], dtype=torch.int64, device=device),
            positions=torch.tensor(lens_np - 1, dtype=torch.int64, device=device),
            seq_lens=torch.tensor(lens_np, dtype=torch.int64, device=device),
            seq_lens_np=lens_np,
            rows_np=np.array([r.row for r in reqs], dtype=np.int64),
            req_ids=torch.tensor([r.req_id for r in reqs], dtype=torch.int64, device=device),
            out_loc=torch.tensor([r.out_loc for r in reqs], dtype=torch.int64, device=device),
            split_far=bool(lens_np.size) and int(lens_np.max()) > far_split,
        )

    @classmethod
    def dummy(
        cls,
        band_index: int,
        bs: int,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        seq_lens: torch.Tensor,
        out_loc: torch.Tensor,
        split_far: bool,
    ) -> "DecodeBatch":
        return cls(
            band_index=band_index,
            size=bs,
            input_ids=input_ids,
            positions=positions,
            seq_lens=seq_lens,
            seq_lens_np=np.ones(bs, dtype=np.int64),
            rows_np=np.zeros(bs, dtype=np.int64),
            req_ids=torch.zeros(bs, dtype=torch.int64, device=input_ids.device),
            out_loc=out_loc,
            split_far=split_far,
        )
