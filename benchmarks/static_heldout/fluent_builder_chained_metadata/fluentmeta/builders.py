"""Fluent attention-metadata builders: ``copy.copy(proto).with_seq_lens(...).with_pages().for_bucket(bs).build()``.

Each ``with_*`` returns ``self``. One prototype is kept per CUDA-graph bucket (built on the graph wrapper's buffers);
a step works on a shallow copy, so per-step fields never leak into the prototype while the tensors stay shared.
"""
import logging
from typing import Optional, Self

import torch

from .config import EngineConfig
from .metadata import DecodeMetadata, PrefillMetadata

logger = logging.getLogger(__name__)


class MetadataBuilder:
    def __init__(self, cfg: EngineConfig, req_to_page: torch.Tensor):
        self.cfg, self.req_to_page, self.device = cfg, req_to_page, req_to_page.device
        self.dims = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)
        self._seq_lens = self._seq_lens_cpu = self._req_indices = None
        self._bucket: Optional[int] = None
        self._plan_info: Optional[tuple] = None  # ok: FC103

    def with_seq_lens(self, seq_lens: torch.Tensor, seq_lens_cpu: Optional[torch.Tensor] = None) -> Self:
        if seq_lens_cpu is None:
            seq_lens_cpu = seq_lens.cpu()  # expect: FC101
        assert seq_lens.shape == seq_lens_cpu.shape, "device and host lengths disagree"  # expect: FC109
        self._seq_lens, self._seq_lens_cpu = seq_lens, seq_lens_cpu
        self._max_len = int(seq_lens_cpu.max())  # ok: FC101
        return self

    def with_requests(self, req_indices: torch.Tensor) -> Self:
        if (req_indices < 0).any():  # expect: FC101
            raise ValueError(f"freed request slot in batch: {req_indices}")  # ok: FC101
        self._req_indices = req_indices
        return self

    def for_bucket(self, bs: int) -> Self:
        assert bs >= self._seq_lens_cpu.shape[0], "bucket smaller than the batch"  # expect: FC109
        self._bucket = bs
        return self


class DecodeMetadataBuilder(MetadataBuilder):
    """Paged decode; graph-mode when its wrapper was built on these very buffers."""

    window_left = -1

    def __init__(self, cfg, req_to_page, wrapper, kv_indptr, kv_indices, kv_last_page_len, graph_mode=False):
        super().__init__(cfg, req_to_page)
        self.wrapper, self.kv_indptr = wrapper, kv_indptr
        self.kv_indices, self.kv_last_page_len = kv_indices, kv_last_page_len
        self.kv_indptr_cpu = torch.zeros(kv_indptr.shape[0], dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(kv_indptr.shape[0] - 1, dtype=torch.int32, pin_memory=True)
        self.graph_mode = graph_mode
        self._skip_cpu: Optional[torch.Tensor] = None
        self.block_tables: Optional[torch.Tensor] = None

    def with_window(self, window_left: int) -> Self:
        self.window_left = window_left
        return self

    def with_pages(self) -> Self:
        lens_cpu, ps = self._seq_lens_cpu, self.cfg.page_size
        n = lens_cpu.shape[0]
        self._skip_cpu = torch.clamp(lens_cpu - self.window_left, min=0) // ps if self.window_left > 0 else None
        pages_cpu = (lens_cpu + ps - 1) // ps - (0 if self._skip_cpu is None else self._skip_cpu)
        torch.cumsum(pages_cpu, 0, out=self.kv_indptr_cpu[1 : n + 1])  # ok: FC104
        self.kv_last_page_len_cpu[:n] = (lens_cpu - 1) % ps + 1
        return self

    def with_block_tables(self) -> Self:
        """trtllm-gen walks per-request block tables rather than the flat page list."""
        max_pages = (self._seq_lens.max() + self.cfg.page_size - 1) // self.cfg.page_size
        n, width = self._seq_lens_cpu.shape[0], self.cfg.max_pages_per_req
        self.block_tables = torch.zeros(n, width, dtype=torch.int32, device=self.device)  # expect: FC107
        self.block_tables[:, :max_pages] = self.req_to_page[self._req_indices, :max_pages]  # expect: FC101
        return self

    def reuse_plan_of(self, other: "DecodeMetadataBuilder") -> Self:
        """Buckets whose padded batches are identical share one plan instead of planning twice."""
        info = other.wrapper._plan_info  # expect: FC103
        setattr(self.wrapper, "_plan_info", info)  # expect: FC103
        return self

    def _gather_indices(self, req_indices: torch.Tensor, n: int) -> torch.Tensor:
        rows = self.req_to_page[req_indices]
        pages = (self.kv_indptr_cpu[1 : n + 1] - self.kv_indptr_cpu[:n]).to(self.device, non_blocking=True)
        cols = torch.arange(rows.shape[1], device=self.device)[None, :]
        if self._skip_cpu is not None:
            cols = cols - self._skip_cpu[:n].to(self.device, non_blocking=True)[:, None]
        return rows[(cols >= 0) & (cols < pages[:, None])]  # expect: FC101

    def reset(self) -> None:
        self.kv_indptr.zero_()  # expect: FC104

    def build(self) -> DecodeMetadata:
        assert self._seq_lens_cpu is not None, "with_seq_lens() must come first"  # ok: FC109
        n = self._seq_lens_cpu.shape[0]
        bs = self._bucket or n
        total = int(self.kv_indptr_cpu[n])  # ok: FC101
        if bs > n:
            self.kv_indptr_cpu[n + 1 : bs + 1] = total
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:total].copy_(self._gather_indices(self._req_indices, n))  # ok: FC104
        self.wrapper.plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1], self.kv_indices, self.kv_last_page_len_cpu[:bs], *self.dims,
            q_data_type=torch.bfloat16, block_tables=self.block_tables,
        )
        self._plan_info = (bs, total)  # ok: FC103
        self.kv_last_page_len[:bs].copy_(self.kv_last_page_len_cpu[:bs], non_blocking=True)  # expect: FC104
        last_page_len = self.kv_last_page_len[:bs]
        return DecodeMetadata(bs, self.wrapper, self.kv_indptr[: bs + 1], self.kv_indices, last_page_len)


class WindowDecodeBuilder(DecodeMetadataBuilder):
    """Sliding-window layers: pages before the window are skipped, the kernel masks the partial first page."""

    def build(self) -> DecodeMetadata:
        n = self._seq_lens_cpu.shape[0]
        clipped = (self._skip_cpu > 0).nonzero()  # ok: FC101
        total = int(self.kv_indptr_cpu[n])  # ok: FC101
        self.kv_indptr[: n + 1].copy_(self.kv_indptr_cpu[: n + 1], non_blocking=True)
        self.kv_indices[:total].copy_(self._gather_indices(self._req_indices, n))
        logger.debug("window of %d clips %d of %d requests", self.window_left, clipped.numel(), n)
        self.wrapper.plan(  # expect: FC102
            self.kv_indptr[: n + 1], self.kv_indices, self.kv_last_page_len_cpu[:n], *self.dims,
            window_left=self.window_left,
        )
        return DecodeMetadata(n, self.wrapper, self.kv_indptr[: n + 1], self.kv_indices, self.kv_last_page_len[:n])


class PrefillMetadataBuilder(MetadataBuilder):
    """Extend batches: ragged attention when no request has a cached prefix, paged otherwise."""

    def __init__(self, cfg: EngineConfig, req_to_page: torch.Tensor, paged_wrapper, ragged_wrapper):
        super().__init__(cfg, req_to_page)
        self.paged_wrapper, self.ragged_wrapper = paged_wrapper, ragged_wrapper
        max_reqs = cfg.max_running_requests
        self.qo_indptr = torch.zeros(max_reqs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices = torch.zeros(cfg.num_pages, dtype=torch.int32, device=self.device)
        self.kv_last_page_len = torch.ones(max_reqs, dtype=torch.int32, device=self.device)
        self.kv_indptr_cpu = torch.zeros(max_reqs + 1, dtype=torch.int32, pin_memory=True)
        self.qo_indptr_cpu: Optional[torch.Tensor] = None

    def with_extend(self, extend_lens: torch.Tensor, extend_lens_cpu: torch.Tensor, prefix_lens_cpu) -> Self:
        assert extend_lens_cpu.shape == prefix_lens_cpu.shape, "one prefix length per request"  # expect: FC109
        self._longest_extend = max(extend_lens.tolist())  # expect: FC101
        self._extend_lens, self._extend_lens_cpu, self._prefix_lens_cpu = extend_lens, extend_lens_cpu, prefix_lens_cpu
        return self

    def build(self) -> PrefillMetadata:
        n = self._extend_lens_cpu.shape[0]
        use_ragged = not bool(self._prefix_lens_cpu.any())  # ok: FC101
        if self.qo_indptr_cpu is None or self.qo_indptr_cpu.shape[0] < n + 1:
            self.qo_indptr_cpu = torch.zeros(2 * (n + 1), dtype=torch.int32, pin_memory=True)  # ok: FC107
        torch.cumsum(self._extend_lens_cpu, 0, out=self.qo_indptr_cpu[1 : n + 1])
        self.qo_indptr = torch.cat([self.qo_indptr[:1], torch.cumsum(self._extend_lens, 0, dtype=torch.int32)])  # expect: FC107
        num_tokens = self.qo_indptr[n].item()  # expect: FC101
        if num_tokens > self.cfg.max_num_tokens:  # ok: FC101
            raise ValueError(f"extend batch of {num_tokens} tokens exceeds max_num_tokens")
        qo_cpu = self.qo_indptr_cpu[: n + 1]
        if use_ragged:
            self.ragged_wrapper.plan(qo_cpu, qo_cpu, *self.dims[:3], causal=True)  # ok: FC102
        else:
            pages_cpu = (self._seq_lens_cpu + self.cfg.page_size - 1) // self.cfg.page_size
            torch.cumsum(pages_cpu, 0, out=self.kv_indptr_cpu[1 : n + 1])
            self.kv_last_page_len[:n] = (self._seq_lens - 1) % self.cfg.page_size + 1  # ok: FC104
            self.paged_wrapper.plan(  # expect: FC102
                qo_cpu, self.kv_indptr_cpu[: n + 1], self.kv_indices, self.kv_last_page_len[:n], *self.dims, causal=True
            )
        logger.debug("extend n=%d ragged=%s longest=%d", n, use_ragged, self._longest_extend)
        return PrefillMetadata(self.qo_indptr, qo_cpu, use_ragged)
