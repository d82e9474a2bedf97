"""Immutable per-step attention metadata.

Nothing here is edited in place: a new step's metadata are a `dataclasses.replace` / `_replace` /
`copy.copy` of the previous value or of a prototype, or come out of a `with_*` chain on a
`__slots__` view.  Tensor fields are shared between copies unless a copy passes a new one.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, fields, replace
from typing import Any, Dict, List, NamedTuple, Optional, Union

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from snapserve.config import PAGE_SIZE, EngineConfig


@dataclass(frozen=True)
class DecodeMetadata:
    num_reqs: int
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    seq_lens: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
    bucket: int = 0
    plan_info: Any = None

    def num_pages(self) -> int:
        return int(self.kv_indptr_cpu[self.num_reqs])


@dataclass(frozen=True)
class DecodePlanArgs:
    """Positional order of `BatchDecodeWithPagedKVCacheWrapper.plan`."""

    indptr: torch.Tensor
    indices: torch.Tensor
    last_page_len: torch.Tensor
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int

    @classmethod
    def from_meta(cls, meta: DecodeMetadata, cfg: EngineConfig) -> "DecodePlanArgs":
        n = meta.num_reqs
        return cls(
            indptr=meta.kv_indptr_cpu[: n + 1],
            indices=meta.kv_indices,
            last_page_len=meta.kv_last_page_len_cpu[:n],
            num_qo_heads=cfg.num_qo_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            page_size=cfg.page_size,
        )


@dataclass(frozen=True)
class PrefillPlanArgs:
    """Positional order of `BatchPrefillWithPagedKVCacheWrapper.plan`."""

    qo_indptr: torch.Tensor
    paged_kv_indptr: torch.Tensor
    paged_kv_indices: torch.Tensor
    paged_kv_last_page_len: torch.Tensor
    num_qo_heads: int
    num_kv_heads: int
    head_dim_qk: int
    page_size: int


class PrefillPlan(NamedTuple):
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len: torch.Tensor
    num_tokens: Union[int, torch.Tensor]
    causal: bool = True


class DraftMeta(NamedTuple):
    """Metadata of the one-layer MTP draft decode, replayed inside the target's decode graph."""

    wrapper: BatchDecodeWithPagedKVCacheWrapper
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    num_reqs: int = 0


class RequestUpdate(NamedTuple):
    req_idx: int
    num_accepted: torch.Tensor  # 0-d, on the device: produced by the verify kernel
    num_accepted_cpu: int
    new_page: int = -1


class BlockTableView:
    """A read-only view of the block table for the trtllm-gen overflow path.

    `with_*` builders return a new view; `clone()` is the shallow copy they start from.
    """

    __slots__ = ("block_table", "seq_lens", "seq_lens_cpu", "num_reqs", "_plan_info")

    def __init__(
        self,
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        num_reqs: int = 0,
        plan_info: Optional[Dict[str, int]] = None,
    ):
        self.block_table = block_table
        self.seq_lens = seq_lens
        self.seq_lens_cpu = seq_lens_cpu
        self.num_reqs = num_reqs
        self._plan_info = plan_info

    def clone(self) -> "BlockTableView":
        info = None if self._plan_info is None else dict(self._plan_info)  # ok: FC103
        return BlockTableView(self.block_table, self.seq_lens, self.seq_lens_cpu, self.num_reqs, info)

    def with_seq_lens(self, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor) -> "BlockTableView":
        assert seq_lens.shape == seq_lens_cpu.shape, "device and host lengths disagree"  # expect: FC109
        view = self.clone()
        view.seq_lens = seq_lens
        view.seq_lens_cpu = seq_lens_cpu
        view.num_reqs = seq_lens_cpu.shape[0]
        return view

    def with_block_table(self, block_table: torch.Tensor) -> "BlockTableView":
        view = self.clone()
        view.block_table = block_table
        return view

    def max_seq_len(self) -> int:
        return int(self.seq_lens_cpu.max())  # ok: FC101

    def remember_launch(self, max_seq_len: int) -> "BlockTableView":
        info = {"max_seq_len": max_seq_len, "num_reqs": self.num_reqs}
        return BlockTableView(self.block_table, self.seq_lens, self.seq_lens_cpu, self.num_reqs, info)

    def launch_record(self) -> Dict[str, int]:
        return dict(self._plan_info or {})


def apply_update(meta: DecodeMetadata, upd: RequestUpdate) -> DecodeMetadata:
    """Fold one accepted-token update into the metadata (host mirrors only)."""
    accepted = int(upd.num_accepted)  # expect: FC101
    seq_lens_cpu = meta.seq_lens_cpu.clone()
    seq_lens_cpu[upd.req_idx] += accepted
    last_cpu = meta.kv_last_page_len_cpu.clone()
    last_cpu[upd.req_idx] = (int(seq_lens_cpu[upd.req_idx]) - 1) % PAGE_SIZE + 1
    return replace(meta, seq_lens_cpu=seq_lens_cpu, kv_last_page_len_cpu=last_cpu)


def _advance_host(meta: DecodeMetadata, upd: RequestUpdate) -> DecodeMetadata:
    seq_lens_cpu = meta.seq_lens_cpu.clone()
    new_len = int(meta.seq_lens_cpu[upd.req_idx]) + upd.num_accepted_cpu  # ok: FC101
    seq_lens_cpu[upd.req_idx] = new_len
    return replace(meta, seq_lens_cpu=seq_lens_cpu)


def fold_request_updates(meta: DecodeMetadata, updates: List[RequestUpdate]) -> DecodeMetadata:
    assert len(updates) <= meta.num_reqs, "more updates than requests"  # expect: FC109
    return functools.reduce(apply_update, updates, meta)


def fold_host_updates(meta: DecodeMetadata, updates: List[RequestUpdate]) -> DecodeMetadata:
    if len(updates) > meta.num_reqs:
        raise ValueError(f"{len(updates)} updates for {meta.num_reqs} requests")
    return functools.reduce(_advance_host, updates, meta)


def detached(meta: DecodeMetadata) -> DecodeMetadata:
    """A copy that owns its tensors and holds no wrapper: safe to keep past the step."""
    return copy.deepcopy(replace(meta, wrapper=None, plan_info=None))


def host_fields(meta: DecodeMetadata) -> Dict[str, Any]:
    return {f.name: getattr(meta, f.name) for f in fields(meta) if f.name.endswith("_cpu")}
