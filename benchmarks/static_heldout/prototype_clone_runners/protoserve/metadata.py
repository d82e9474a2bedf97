"""Per-step metadata records.

A runner keeps one ``StepMetadata`` template whose tensor fields are the views of its
``DecodeBuffers``; every step derives its record from that template, with
``copy.copy`` (same buffers, new scalar fields) or ``dataclasses.replace`` (same buffers
except the fields passed in).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import List, Optional

import numpy as np
import torch

from protoserve.buffers import DecodeBuffers


@dataclasses.dataclass
class ScheduledBatch:
    """What the scheduler hands the model runner for one step."""

    req_ids: List[int]
    input_ids: torch.Tensor  # [num_tokens] on the device
    positions: torch.Tensor  # [num_tokens] or [3, num_tokens] (M-RoPE) on the device
    seq_lens_np: np.ndarray  # [bs] total lengths after this step
    pages_per_req_np: np.ndarray  # [bs]
    page_ids: torch.Tensor  # [sum(pages_per_req)] on the device, gathered from req_to_page
    extend_lens_np: Optional[np.ndarray] = None  # None for a pure decode batch
    num_draft_tokens: int = 0
    next_page_ids: Optional[torch.Tensor] = None  # pages the scheduler will touch next step

    @property
    def batch_size(self) -> int:
        return len(self.req_ids)

    @property
    def is_decode(self) -> bool:
        return self.extend_lens_np is None and self.num_draft_tokens == 0


@dataclasses.dataclass
class SharedPrefixInfo:
    """Level 0 of a two-level cascade: the system prompt every request of the batch shares."""

    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_cpu: torch.Tensor


@dataclasses.dataclass
class StepMetadata:
    batch_size: int
    bucket: int
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    page_ids: Optional[torch.Tensor] = None
    qo_indptr: Optional[torch.Tensor] = None
    qo_indptr_cpu: Optional[torch.Tensor] = None
    prefix: Optional[SharedPrefixInfo] = None
    max_seq_len: int = 0
    use_graph: bool = False

    @classmethod
    def over(cls, bufs: DecodeBuffers) -> "StepMetadata":
        """The template of a runner: every tensor field is its buffer set's storage."""
        return cls(
            batch_size=0,
            bucket=bufs.max_bs,
            seq_lens=bufs.seq_lens,
            seq_lens_cpu=bufs.seq_lens_cpu,
            kv_indptr=bufs.kv_indptr,
            kv_indptr_cpu=bufs.kv_indptr_cpu,
            kv_indices=bufs.kv_indices,
            kv_last_page_len=bufs.kv_last_page_len,
            kv_last_page_len_cpu=bufs.kv_last_page_len_cpu,
        )


def rebase(template: StepMetadata, bufs: DecodeBuffers) -> StepMetadata:
    """The same template over another buffer set (a deep-cloned runner's)."""
    return dataclasses.replace(
        template,
        seq_lens=bufs.seq_lens,
        seq_lens_cpu=bufs.seq_lens_cpu,
        kv_indptr=bufs.kv_indptr,
        kv_indptr_cpu=bufs.kv_indptr_cpu,
        kv_indices=bufs.kv_indices,
        kv_last_page_len=bufs.kv_last_page_len,
        kv_last_page_len_cpu=bufs.kv_last_page_len_cpu,
    )


def fill_host_mirrors(meta: StepMetadata, batch: ScheduledBatch, page_size: int) -> None:
    """Write the batch's lengths into the record's pinned mirrors, padded to ``meta.bucket``."""
    bs, bucket = meta.batch_size, meta.bucket
    seq = batch.seq_lens_np.astype(np.int32)
    meta.seq_lens_cpu.numpy()[:bs] = seq
    meta.seq_lens_cpu.numpy()[bs:bucket] = 1
    indptr = meta.kv_indptr_cpu.numpy()
    indptr[0] = 0
    np.cumsum(batch.pages_per_req_np, out=indptr[1 : bs + 1])
    indptr[bs + 1 : bucket + 1] = indptr[bs]
    last = meta.kv_last_page_len_cpu.numpy()
    last[:bs] = (seq - 1) % page_size + 1
    last[bs:bucket] = 1
    meta.max_seq_len = int(seq.max()) if bs else 0  # ok: FC101


def derive_eager_meta(
    template: StepMetadata, batch: ScheduledBatch, eager_bufs: DecodeBuffers, device: torch.device
) -> StepMetadata:
    """Record of a step that runs without a graph: prefill, mixed, or a batch above the buckets."""
    n = batch.batch_size
    seq_lens = torch.from_numpy(batch.seq_lens_np.astype(np.int32)).to(device, non_blocking=True)
    qo_indptr = qo_indptr_cpu = None
    if batch.extend_lens_np is not None:
        qo_host = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(batch.extend_lens_np, out=qo_host[1:])
        qo_indptr_cpu = torch.from_numpy(qo_host).pin_memory()
        extend_lens = torch.from_numpy(batch.extend_lens_np.astype(np.int32)).to(device)
        qo_indptr = torch.zeros(n + 1, dtype=torch.int32, device=device)
        torch.cumsum(extend_lens, 0, out=qo_indptr[1:])
    meta = dataclasses.replace(
        template,
        batch_size=n,
        bucket=n,
        seq_lens=seq_lens,
        seq_lens_cpu=eager_bufs.seq_lens_cpu,
        kv_indptr=eager_bufs.kv_indptr,
        kv_indptr_cpu=eager_bufs.kv_indptr_cpu,
        kv_indices=eager_bufs.kv_indices,
        kv_last_page_len=eager_bufs.kv_last_page_len,
        kv_last_page_len_cpu=eager_bufs.kv_last_page_len_cpu,
        page_ids=batch.page_ids,
        qo_indptr=qo_indptr,
        qo_indptr_cpu=qo_indptr_cpu,
        use_graph=False,
    )
    meta.max_seq_len = int(seq_lens.max())  # expect: FC101
    return meta


def host_view(meta: StepMetadata) -> StepMetadata:
    """The record with its host mirrors in the tensor slots, for code that only reads lengths."""
    return dataclasses.replace(
        meta,
        seq_lens=meta.seq_lens_cpu,
        kv_indptr=meta.kv_indptr_cpu,
        kv_last_page_len=meta.kv_last_page_len_cpu,
    )


def for_bucket(template: StepMetadata, bs: int, bucket: int) -> StepMetadata:
    meta = copy.copy(template)
    meta.batch_size = bs
    meta.bucket = bucket
    meta.use_graph = True
    return meta
