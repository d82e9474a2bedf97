"""Device-side view of a split plan, and the per-chunk plan helper."""

from dataclasses import dataclass
from typing import List

import torch

from splitkv import SplitConfig, SplitPlan


@dataclass
class ChunkTensors:
    qo_indptr: torch.Tensor
    kv_indptr: List[torch.Tensor]
    kv_indices: List[torch.Tensor]
    kv_last_page_len_cpu: torch.Tensor
    kv_page_counts: torch.Tensor


@dataclass
class ChunkStep:
    tensors: ChunkTensors
    num_chunks: int
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_kv: torch.Tensor
    max_kv_len: int


def upload_plan(plan: SplitPlan, staged_pages: torch.Tensor, page_size: int, device) -> ChunkTensors:
    indptrs, indices = [], []
    for s, e in plan.chunk_page_ranges:
        indptrs.append(torch.tensor([0, e - s], dtype=torch.int32, device=device))
        indices.append(staged_pages[s:e])
    counts = [e - s for s, e in plan.chunk_page_ranges]
    return ChunkTensors(
        qo_indptr=torch.tensor([0, plan.q_len], dtype=torch.int32).to(device),
        kv_indptr=indptrs,
        kv_indices=indices,
        kv_last_page_len_cpu=torch.full((1,), page_size, dtype=torch.int32),
        kv_page_counts=torch.tensor(counts, dtype=torch.int32, device=device),
    )


def plan_chunk(wrapper, qo_indptr, kv_indptr, kv_indices, last_page_len, cfg: SplitConfig, causal: bool) -> None:
    wrapper.plan(  # expect: FC102
        qo_indptr,
        kv_indptr,
        kv_indices,
        last_page_len,
        cfg.num_qo_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.page_size,
        causal=causal,
        q_data_type=torch.bfloat16,
    )
