"""Host-side batch construction. The scheduler decides how every prompt is split across the SP ranks,
so the all-to-all split sizes and every FlashInfer planning array are known on the host."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from ulysses_sp.config import SPConfig


@dataclass
class ShardPlan:
    """How one prompt's new tokens are split across the SP ranks."""

    rid: int
    full_len: int
    prefix_len: int  # tokens already held in the prefix cache
    rank_counts: np.ndarray  # new tokens held by each SP rank

    @property
    def new_len(self) -> int:
        return self.full_len - self.prefix_len


@dataclass
class UlyssesPrefillMeta:
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    prefix_kv_indptr: torch.Tensor
    prefix_kv_indices: torch.Tensor
    prefix_last_page_len_cpu: torch.Tensor
    new_page_ids: torch.Tensor
    new_kv_indptr: torch.Tensor
    new_last_page_len: torch.Tensor
    batch_indices: torch.Tensor
    positions: torch.Tensor
    send_counts: list
    recv_counts: list
    num_new_pages: int
    has_prefix: bool


@dataclass
class DecodeInputs:
    num_reqs: int
    num_pages: int
    seq_lens: torch.Tensor  # device, read by the sampler's length penalty
    kv_indptr_cpu: torch.Tensor  # pinned
    kv_indices: torch.Tensor  # device
    last_page_len_cpu: torch.Tensor  # pinned
    last_page_len: torch.Tensor  # device, read by the KV append kernel

    @property
    def max_seq_len(self) -> int:
        return int(self.seq_lens.max())  # expect: FC101


@dataclass
class ForwardBatch:
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    batch_indices: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    decode_wrapper: Any = None
    extend_qo_indptr_cpu: Optional[torch.Tensor] = None


def build_prefill_meta(
    shards: list[ShardPlan],
    page_tables: dict[int, np.ndarray],
    new_pages: dict[int, np.ndarray],
    cfg: SPConfig,
    device: torch.device,
) -> UlyssesPrefillMeta:
    assert all(int(s.rank_counts.sum()) == s.new_len for s in shards), "shard plan does not cover the prompt"  # expect: FC109
    n = len(shards)
    page = cfg.page_size
    new_lens = np.array([s.new_len for s in shards], dtype=np.int32)
    prefix_lens = np.array([s.prefix_len for s in shards], dtype=np.int32)

    qo_indptr = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(new_lens, out=qo_indptr[1:])

    prefix_pages = [page_tables[s.rid][: -(-s.prefix_len // page)] for s in shards]
    page_counts = np.array([len(p) for p in prefix_pages], dtype=np.int32)
    prefix_indptr = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(page_counts, out=prefix_indptr[1:])
    prefix_last = np.where(prefix_lens > 0, (prefix_lens - 1) % page + 1, 0).astype(np.int32)
    prefix_indices = np.concatenate(prefix_pages) if n else np.zeros(0, dtype=np.int32)
    fresh = np.concatenate([new_pages[s.rid] for s in shards]) if n else np.zeros(0, dtype=np.int32)
    # new tokens start on a fresh page: the prefix cache matches whole pages only
    new_page_counts = (new_lens + page - 1) // page
    new_indptr = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(new_page_counts, out=new_indptr[1:])
    new_last = ((new_lens - 1) % page + 1).astype(np.int32)
    batch_idx = np.repeat(np.arange(n, dtype=np.int32), new_lens)
    pos = np.concatenate([np.arange(k, dtype=np.int32) for k in new_lens]) if n else np.zeros(0, dtype=np.int32)

    # tokens each rank holds in this batch: the all-to-all receives that many rows from it
    rank_totals = np.stack([s.rank_counts for s in shards]).sum(axis=0)
    local = int(rank_totals[cfg.sp_rank])
    recv_counts = rank_totals.tolist()  # ok: FC101
    send_counts = [local] * cfg.sp_size

    qo_cpu = torch.from_numpy(qo_indptr).pin_memory()
    return UlyssesPrefillMeta(
        qo_indptr_cpu=qo_cpu,
        kv_indptr_cpu=qo_cpu,
        prefix_kv_indptr=torch.tensor(prefix_indptr, dtype=torch.int32, device=device),
        prefix_kv_indices=torch.tensor(prefix_indices, dtype=torch.int32, device=device),
        prefix_last_page_len_cpu=torch.from_numpy(prefix_last).pin_memory(),
        new_page_ids=torch.from_numpy(fresh.astype(np.int32)).to(device, non_blocking=True),
        new_kv_indptr=torch.from_numpy(new_indptr).to(device, non_blocking=True),
        new_last_page_len=torch.from_numpy(new_last).to(device, non_blocking=True),
        batch_indices=torch.from_numpy(batch_idx).to(device, non_blocking=True),
        positions=torch.from_numpy(pos).to(device, non_blocking=True),
        send_counts=send_counts,
        recv_counts=recv_counts,
        num_new_pages=int(fresh.shape[0]),
        has_prefix=bool(prefix_lens.any()),
    )


def build_decode_inputs(
    rids: list[int],
    seq_lens_np: np.ndarray,
    page_tables: dict[int, np.ndarray],
    cfg: SPConfig,
    device: torch.device,
) -> DecodeInputs:
    n = len(rids)
    page = cfg.page_size
    pages_per = (seq_lens_np + page - 1) // page
    indptr = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(pages_per, out=indptr[1:])
    indices = np.concatenate([page_tables[r][:k] for r, k in zip(rids, pages_per)])
    last_cpu = torch.from_numpy(((seq_lens_np - 1) % page + 1).astype(np.int32)).pin_memory()
    return DecodeInputs(
        num_reqs=n,
        num_pages=int(indptr[-1]),  # ok: FC101
        seq_lens=torch.from_numpy(seq_lens_np.astype(np.int32)).to(device, non_blocking=True),
        kv_indptr_cpu=torch.from_numpy(indptr).pin_memory(),
        kv_indices=torch.from_numpy(indices.astype(np.int32)).to(device, non_blocking=True),
        last_page_len_cpu=last_cpu,
        last_page_len=last_cpu.to(device, non_blocking=True),
    )
