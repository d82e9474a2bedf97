"""Packing scoring requests into one ragged batch (host work, numpy)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch


@dataclass
class ScoreRequest:
    rid: str
    prompt_ids: List[int]
    response_ids: List[int]
    critique: bool = False
    pair_id: Optional[str] = None


@dataclass
class RaggedBatch:
    request_ids: List[str]
    input_ids_gpu: torch.Tensor
    positions_gpu: torch.Tensor
    cu_seqlens_cpu: torch.Tensor
    cu_seqlens_gpu: torch.Tensor
    segment_ids_gpu: torch.Tensor
    last_index_gpu: torch.Tensor
    total_tokens: int
    resp_row_ids_gpu: Optional[torch.Tensor] = None  # row of every response token, in token order
    resp_counts_gpu: Optional[torch.Tensor] = None
    critique_rows: List[int] = field(default_factory=list)
    critique_tok_idx_gpu: Optional[torch.Tensor] = None
    critique_out_loc_gpu: Optional[torch.Tensor] = None


def pack_requests(reqs: Sequence[ScoreRequest], device: torch.device, response_segment: int) -> Tuple[RaggedBatch, np.ndarray]:
    """One ragged batch of prompt+response sequences; also returns the host lengths."""
    lens_np = np.array([len(r.prompt_ids) + len(r.response_ids) for r in reqs], dtype=np.int32)
    cu = np.zeros(len(reqs) + 1, dtype=np.int32)
    np.cumsum(lens_np, out=cu[1:])
    ids = np.concatenate([np.asarray(r.prompt_ids + r.response_ids, dtype=np.int64) for r in reqs])
    seg = np.concatenate(
        [np.r_[np.zeros(len(r.prompt_ids), np.int8), np.full(len(r.response_ids), response_segment, np.int8)] for r in reqs]
    )
    pos = np.concatenate([np.arange(n, dtype=np.int64) for n in lens_np])

    def dev(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).pin_memory().to(device, non_blocking=True)

    cu_cpu = torch.tensor(cu, dtype=torch.int32, pin_memory=True)
    batch = RaggedBatch(
        request_ids=[r.rid for r in reqs],
        input_ids_gpu=dev(ids),
        positions_gpu=dev(pos),
        cu_seqlens_cpu=cu_cpu,
        cu_seqlens_gpu=cu_cpu.to(device, non_blocking=True),
        segment_ids_gpu=dev(seg),
        last_index_gpu=dev((cu[1:] - 1).astype(np.int64)),
        total_tokens=int(cu[-1]),
        resp_row_ids_gpu=dev(np.repeat(np.arange(len(reqs), dtype=np.int64), [len(r.response_ids) for r in reqs])),
        resp_counts_gpu=dev(np.array([len(r.response_ids) for r in reqs], dtype=np.float32)),
        critique_rows=[i for i, r in enumerate(reqs) if r.critique],
    )
    return batch, lens_np
