"""Per-step attention metadata: the scheduler hands host lists, ``__post_init__`` uploads them once per step."""
import dataclasses
import functools
import itertools
from typing import Optional, Sequence

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from .config import PAGE_SIZE, ServeConfig


@dataclasses.dataclass
class Req:
    seq_len: int
    page_ids: list[int]
    extend_len: int = 1


@dataclasses.dataclass
class PagedPlanArgs:
    """``plan()`` arguments of a paged decode wrapper, in its positional order (handed over with ``astuple``)."""

    indptr: torch.Tensor
    indices: torch.Tensor
    last_page_len: torch.Tensor
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int


@dataclasses.dataclass
class RaggedPlanArgs:
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    num_qo_heads: int
    num_kv_heads: int
    head_dim_qk: int
    causal: bool = True


@dataclasses.dataclass
class GraphBuffers:
    """Persistent inputs of the captured decode graphs, sized for the largest bucket; built once."""

    max_bs: int
    max_pages: int
    device: torch.device

    def __post_init__(self) -> None:
        self.kv_indptr = torch.zeros(self.max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices = torch.zeros(self.max_pages, dtype=torch.int32, device=self.device)
        self.kv_last_page_len = torch.ones(self.max_bs, dtype=torch.int32, device=self.device)
        self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32, device=self.device)
        self.kv_indptr_host = torch.zeros(self.max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(self.max_bs, dtype=torch.int32, pin_memory=True)


@dataclasses.dataclass
class DecodeMetadata:
    seq_lens_host: list[int]
    page_ids_host: list[list[int]]
    device: torch.device
    wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
    page_size: int = PAGE_SIZE
    draft_tokens: list[int] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        assert len(self.seq_lens_host) == len(self.page_ids_host), "one page list per request"  # expect: FC109
        counts = [len(ids) for ids in self.page_ids_host]
        self.kv_indptr_cpu = torch.tensor([0, *itertools.accumulate(counts)], dtype=torch.int32).pin_memory()
        last = [(n - 1) % self.page_size + 1 for n in self.seq_lens_host]
        self.last_page_len_cpu = torch.tensor(last, dtype=torch.int32).pin_memory()
        self.seq_lens = torch.tensor(self.seq_lens_host, dtype=torch.int32, device=self.device)  # ok: FC107
        self.kv_indptr = torch.zeros(len(counts) + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(torch.tensor(counts, dtype=torch.int32, device=self.device), 0, out=self.kv_indptr[1:])  # ok: FC104
        self.kv_indices = torch.tensor([p for ids in self.page_ids_host for p in ids], dtype=torch.int32, device=self.device)
        self.kv_last_page_len = self.last_page_len_cpu.to(self.device, non_blocking=True)
        self.total_pages = int(self.kv_indptr_cpu[-1])  # ok: FC101
        self.max_seq_len = int(self.seq_lens.max())  # expect: FC101

    @classmethod
    def from_requests(cls, reqs: Sequence[Req], device: torch.device, **kwargs) -> "DecodeMetadata":
        assert reqs, "empty decode batch"  # expect: FC109
        return cls([r.seq_len for r in reqs], [r.page_ids for r in reqs], device, **kwargs)

    @classmethod
    def for_capture(cls, bufs: GraphBuffers, bs: int, wrapper: BatchDecodeWithPagedKVCacheWrapper) -> "DecodeMetadata":
        meta = cls(bufs.seq_lens[:bs].tolist(), [[0]] * bs, bufs.device, wrapper)  # expect: FC101
        meta.seq_lens, meta.kv_indptr, meta.kv_indices = bufs.seq_lens[:bs], bufs.kv_indptr[: bs + 1], bufs.kv_indices
        meta.kv_last_page_len = bufs.kv_last_page_len[:bs]
        return meta

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens_host)

    @functools.cached_property
    def qo_indptr(self) -> torch.Tensor:
        return torch.arange(self.batch_size + 1, dtype=torch.int32, device=self.device)

    @functools.cached_property
    def qo_indptr_cpu(self) -> torch.Tensor:
        return torch.arange(self.batch_size + 1, dtype=torch.int32)

    @functools.cached_property
    def num_pages(self) -> int:
        return int(self.kv_indptr[-1])  # expect: FC101

    @functools.cached_property
    def block_tables(self) -> torch.Tensor:
        width = max(len(ids) for ids in self.page_ids_host)  # ok: FC101
        rows = [ids + [0] * (width - len(ids)) for ids in self.page_ids_host]
        return torch.tensor(rows, dtype=torch.int32, device=self.device)

    def plan_args(self, cfg: ServeConfig) -> PagedPlanArgs:
        assert cfg.page_size == self.page_size, "metadata built for another page size"  # expect: FC109
        return PagedPlanArgs(self.kv_indptr_cpu, self.kv_indices, self.last_page_len_cpu, *cfg.plan_dims())

    def draft_plan_args(self, cfg: ServeConfig) -> PagedPlanArgs:
        return PagedPlanArgs(self.kv_indptr, self.kv_indices, self.kv_last_page_len, *cfg.plan_dims())

    def advance_draft(self) -> None:
        self.kv_last_page_len.add_(1)  # expect: FC104


@dataclasses.dataclass
class PrefillMetadata:
    extend_lens_host: list[int]
    prefix_lens_host: list[int]
    device: torch.device
    chunk_ids: list[int] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.qo_indptr_cpu = torch.tensor([0, *itertools.accumulate(self.extend_lens_host)], dtype=torch.int32)
        self.qo_indptr = self.qo_indptr_cpu.to(self.device, non_blocking=True)
        self.prefix_lens = torch.tensor(self.prefix_lens_host, dtype=torch.int32, device=self.device)
        self.num_tokens = int(self.qo_indptr_cpu[-1])  # ok: FC101
        self.has_prefix = bool((self.prefix_lens > 0).any())  # expect: FC101

    @classmethod
    def from_requests(cls, reqs: Sequence[Req], device: torch.device) -> "PrefillMetadata":
        return cls([r.extend_len for r in reqs], [r.seq_len - r.extend_len for r in reqs], device)

    @functools.cached_property
    def token_to_req(self) -> torch.Tensor:
        rows = torch.arange(len(self.extend_lens_host), device=self.device)
        return torch.repeat_interleave(rows, torch.diff(self.qo_indptr))  # expect: FC101

    @functools.cached_property
    def positions(self) -> torch.Tensor:
        starts = torch.tensor(self.prefix_lens_host, dtype=torch.int64, device=self.device)
        offsets = torch.arange(self.num_tokens, device=self.device) - torch.repeat_interleave(  # ok: FC101
            self.qo_indptr[:-1].to(torch.int64), torch.diff(self.qo_indptr), output_size=self.num_tokens)
        assert offsets.numel() == self.num_tokens, "positions cover every new token"  # ok: FC109
        return offsets + torch.repeat_interleave(starts, torch.diff(self.qo_indptr), output_size=self.num_tokens)

    def build_plan_args(self, cfg: ServeConfig) -> RaggedPlanArgs:
        return RaggedPlanArgs(self.qo_indptr, self.qo_indptr_cpu, cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim)
