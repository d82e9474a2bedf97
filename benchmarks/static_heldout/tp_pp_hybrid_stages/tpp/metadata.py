"""Micro-batch metadata: built on stage 0's scheduler and shipped down the pipeline."""

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper


@dataclass
class MicroBatch:
    index: int
    num_decode: int
    num_chunk_tokens: int
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len: torch.Tensor
    chunk_cu_seqlens_cpu: torch.Tensor
    token_counts: torch.Tensor
    total_tokens_host: int
    graph_bs: Optional[int] = None


def last_page_lens(seq_lens: torch.Tensor, page_size: int) -> torch.Tensor:
    return ((seq_lens - 1) % page_size + 1).to(torch.int32)


def build_chunk_wrapper(workspace: torch.Tensor, layout: str = "NHD") -> BatchPrefillWithRaggedKVCacheWrapper:
    return BatchPrefillWithRaggedKVCacheWrapper(workspace, layout, backend="fa2")


def make_microbatch(index: int, lens_np: np.ndarray, page_rows, chunk_lens_np: np.ndarray, page_size: int,
                    device) -> MicroBatch:
    bs = lens_np.shape[0]
    seq_lens_cpu = torch.from_numpy(lens_np.astype(np.int32)).pin_memory()
    seq_lens = seq_lens_cpu.to(device, non_blocking=True)
    pages = (lens_np + page_size - 1) // page_size
    indptr = np.zeros(bs + 1, dtype=np.int32)
    np.cumsum(pages, out=indptr[1:])
    flat = np.concatenate([page_rows[i][: pages[i]] for i in range(bs)]) if bs else np.zeros(0, np.int32)
    cu = np.zeros(len(chunk_lens_np) + 1, dtype=np.int32)
    np.cumsum(chunk_lens_np, out=cu[1:])
    counts = np.concatenate([np.ones(bs, dtype=np.int32), chunk_lens_np.astype(np.int32)])
    return MicroBatch(
        index=index,
        num_decode=bs,
        num_chunk_tokens=int(cu[-1]),
        seq_lens=seq_lens,
        seq_lens_cpu=seq_lens_cpu,
        kv_indptr_cpu=torch.from_numpy(indptr).pin_memory(),
        kv_indices=torch.from_numpy(flat).to(device, non_blocking=True),
        last_page_len=last_page_lens(seq_lens, page_size),
        chunk_cu_seqlens_cpu=torch.from_numpy(cu).pin_memory(),
        token_counts=torch.from_numpy(counts).to(device, non_blocking=True),
        total_tokens_host=int(counts.sum()),
    )
