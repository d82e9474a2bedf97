"""A rank's own batch and the attention metadata it plans alone."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

import numpy as np
import torch

from dpmoe import DPConfig


@dataclass
class LocalBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    query_lens_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    page_lists: List[List[int]]
    is_decode: bool

    @property
    def num_seqs(self) -> int:
        return len(self.page_lists)

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]


@dataclass
class DPStepMeta:
    num_seqs: int
    num_prefill_tokens: int
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    seq_lens: torch.Tensor
    pages_per_seq: torch.Tensor
    is_dummy: bool = False
    graph_key: Tuple[int, int] = (0, 0)


def make_step_meta(batch: LocalBatch, cfg: DPConfig, device: torch.device) -> DPStepMeta:
    n = batch.num_seqs
    npages = np.fromiter((len(p) for p in batch.page_lists), dtype=np.int32, count=n)
    kv_indptr_cpu = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
    np.cumsum(npages, out=kv_indptr_cpu.numpy()[1:])
    qo_indptr_cpu = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
    torch.cumsum(batch.query_lens_cpu, 0, out=qo_indptr_cpu[1:])
    last_cpu = ((batch.seq_lens_cpu - 1) % cfg.page_size + 1).pin_memory()
    flat = np.concatenate([np.asarray(p, dtype=np.int32) for p in batch.page_lists])
    return DPStepMeta(
        num_seqs=n,
        num_prefill_tokens=0 if batch.is_decode else batch.num_tokens,
        qo_indptr_cpu=qo_indptr_cpu,
        kv_indptr_cpu=kv_indptr_cpu,
        # the device copy feeds the kernel that writes new KV into the pages
        kv_indptr=kv_indptr_cpu.to(device, non_blocking=True),
        kv_indices=torch.from_numpy(flat).pin_memory().to(device, non_blocking=True),
        last_page_len_cpu=last_cpu,
        seq_lens_cpu=batch.seq_lens_cpu,
        seq_lens=batch.seq_lens_cpu.to(device, non_blocking=True),
        pages_per_seq=torch.from_numpy(npages).pin_memory().to(device, non_blocking=True),
    )


def make_dummy_meta(bs: int, device: torch.device) -> DPStepMeta:
    """An idle rank attends one token of page 0 per row so that its collectives line up."""
    ones_cpu = torch.ones(bs, dtype=torch.int32)
    indptr_cpu = torch.arange(bs + 1, dtype=torch.int32)
    return DPStepMeta(
        bs, 0, indptr_cpu, indptr_cpu, indptr_cpu.to(device), torch.zeros(bs, dtype=torch.int32, device=device),
        ones_cpu, ones_cpu, ones_cpu.to(device), ones_cpu.to(device), is_dummy=True,
    )
