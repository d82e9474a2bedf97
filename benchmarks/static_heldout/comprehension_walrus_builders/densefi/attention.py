"""FlashInfer attention backend of the dense engine.

Everything per layer group is built by comprehension at start-up: an eager decode and prefill wrapper per
group, a graph-mode decode wrapper per (full group, captured batch size), persistent device page lists per
group with pinned host mirrors beside them. The metadata builder fills the mirrors with numpy every step;
the wrappers are planned from the mirrors and read the device lists.
"""

from __future__ import annotations

import logging
from itertools import chain, product
from typing import TYPE_CHECKING, Optional

import torch
import torch.nn.functional as F
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
)

from densefi.config import EngineConfig
from densefi.workspace import WorkspacePool, trtllm_workspace_bytes
from densefi_ops.introspect import bound_buffer_table, entry_points
from densefi_ops.trtllm_paths import TrtllmDecodeRunner, trtllm_prefill

if TYPE_CHECKING:
    from densefi.metadata import FlashInferMetadata

logger = logging.getLogger(__name__)

# FlashInfer's names for the buffers a graph-mode decode wrapper keeps -> the backend attribute it should share.
_BOUND_AS = {
    "_paged_kv_indptr_buf": "kv_indptr_gpu",
    "_paged_kv_indices_buf": "kv_indices_gpu",
    "_paged_kv_last_page_len_buf": "last_page_len_gpu",
}


class KVCacheSpec:
    """Layout facts of the paged KV cache, shared by the backend and the KV manager."""

    def __init__(self, layout: str, page_size: int, num_kv_heads: int, head_dim: int) -> None:
        self._kv_layout = layout
        self.page_size = page_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim

    @property
    def layout(self) -> str:
        return self._kv_layout

    def page_shape(self) -> tuple[int, ...]:
        inner = (self.page_size, self.num_kv_heads) if self._kv_layout == "NHD" else (self.num_kv_heads, self.page_size)
        return (2, *inner, self.head_dim)


class SharedPrefixLevels:
    """Host-side description of a two-level cascade: one shared prefix, then each request's own pages."""

    def __init__(self, max_num_seqs: int) -> None:
        self._num_levels = 2
        pinned = dict(dtype=torch.int32, pin_memory=True)
        self.qo_indptr_cpu, self.kv_indptr_cpu, self.last_page_len_cpu = (
            [torch.zeros(n, **pinned) for _ in range(self._num_levels)]
            for n in (max_num_seqs + 1, max_num_seqs + 1, max_num_seqs)
        )
        self.num_prefix_pages = 0

    def levels(self) -> range:
        return range(self._num_levels)  # ok: FC103

    def set_prefix(self, prefix_len: int, page_size: int, num_tokens: int) -> None:
        """Level 0 is one query row covering every token, over the prefix pages."""
        self.num_prefix_pages = -(-prefix_len // page_size)
        qo, kv, last = (level[0] for level in (self.qo_indptr_cpu, self.kv_indptr_cpu, self.last_page_len_cpu))
        qo[:2] = torch.tensor([0, num_tokens], dtype=torch.int32)
        kv[:2] = torch.tensor([0, self.num_prefix_pages], dtype=torch.int32)
        last[:1] = prefix_len - (self.num_prefix_pages - 1) * page_size


class FlashInferBackend:
    """Wrappers, persistent page lists and workspaces of every layer group."""

    def __init__(self, cfg: EngineConfig, pool: WorkspacePool, device: torch.device, cache_spec: KVCacheSpec) -> None:
        self.cfg = cfg
        self.pool = pool
        self.device = device
        self.cache_spec = cache_spec
        self.kv_layout = cache_spec._kv_layout  # ok: FC103
        self.page_size = cfg.page_size
        self.num_qo_heads, self.num_kv_heads, self.head_dim = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        self.groups = cfg.layer_groups
        self.full_groups = tuple(g for g in self.groups if not g.startswith("win"))
        self.group_of = {i: cfg.group_of_layer(i) for i in range(cfg.num_layers)}
        self.layer_window = dict(cfg.layer_window)
        self.first_layer_of = {g: next(iter(cfg.layers_of(g)), 0) for g in self.full_groups}

        max_seqs, max_pages = cfg.max_num_seqs, cfg.max_num_seqs * cfg.max_pages_per_seq
        i32 = dict(dtype=torch.int32, device=device)
        pinned = dict(dtype=torch.int32, pin_memory=True)
        # Persistent device page lists per full group (graph wrappers bind views of them) and their host mirrors.
        self.kv_indptr_gpu = {g: torch.zeros(max_seqs + 1, **i32) for g in self.full_groups}
        self.kv_indices_gpu = {g: torch.zeros(max_pages, **i32) for g in self.full_groups}
        self.last_page_len_gpu = {g: torch.ones(max_seqs, **i32) for g in self.full_groups}
        self.kv_indptr_cpu, self.kv_indices_cpu, self.last_page_len_cpu = (
            {g: torch.zeros(n, **pinned) for g in self.full_groups} for n in (max_seqs + 1, max_pages, max_seqs)
        )
        # Sliding-window groups: page lists computed on the device from the block table, one per window.
        self.window_kv_indptr_gpu = [torch.zeros(max_seqs + 1, **i32) for _ in cfg.window_sizes]
        self.window_kv_indptr_cpu = [torch.zeros(max_seqs + 1, **pinned) for _ in cfg.window_sizes]
        self.window_kv_indices_gpu = [
            torch.zeros(max_seqs * (-(-w // self.page_size) + 1) + 1, **i32) for w in cfg.window_sizes
        ]

        decode_backend = "trtllm-gen" if cfg.use_trtllm_decode else "fa2"
        self.decode_wrappers = {
            g: BatchDecodeWithPagedKVCacheWrapper(pool.decode_workspace, self.kv_layout, backend="fa2")
            for g in self.full_groups
        }
        self.window_workspaces = [
            torch.empty(self._window_workspace_bytes(w), dtype=torch.uint8, device=device)  # expect: FC105
            for w in cfg.window_sizes
        ]
        self.window_wrappers = {
            w: BatchDecodeWithPagedKVCacheWrapper(ws, self.kv_layout, backend=decode_backend)
            for w, ws in zip(cfg.window_sizes, self.window_workspaces)
        }
        self.prefill_wrappers = {
            g: BatchPrefillWithPagedKVCacheWrapper(pool.prefill_workspaces[g], self.kv_layout) for g in self.groups
        }
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(pool.ragged_workspace, self.kv_layout, backend="fa2")
        self.verify_wrappers = {
            g: BatchPrefillWithPagedKVCacheWrapper(ws, self.kv_layout) for g, ws in pool.verify_workspaces.items()
        }
        self.cascade_wrappers = (
            {g: MultiLevelCascadeAttentionWrapper(2, pool.cascade_workspace, self.kv_layout) for g in self.full_groups}
            if cfg.enable_cascade
            else {}
        )
        self.shared_prefix = SharedPrefixLevels(max_seqs) if cfg.enable_cascade else None
        self.graph_wrappers: dict[tuple[str, int], BatchDecodeWithPagedKVCacheWrapper] = {}
        self.trtllm: Optional[TrtllmDecodeRunner] = (
            TrtllmDecodeRunner(cfg.num_copy_streams, device, trtllm_workspace_bytes(cfg), cfg.max_model_len)
            if cfg.use_trtllm_decode
            else None
        )
        self.context_ws_bytes = trtllm_workspace_bytes(cfg) + cfg.max_num_batched_tokens * cfg.num_qo_heads * 8
        self.kv_budget_pages = cfg.kv_budget_tokens // cfg.page_size
        self.check_layouts()

    # ------------------------------------------------------------------ set-up

    def _window_workspace_bytes(self, window: int) -> int:
        pages = -(-window // self.page_size) + 1
        return self.cfg.max_num_seqs * self.num_qo_heads * min(pages, 16) * (self.head_dim + 1) * 4

    def window_left(self, group: str) -> int:
        return int(group[3:]) - 1 if group.startswith("win") else -1

    def check_layouts(self) -> None:
        want = self.cache_spec.layout
        for i, w in enumerate(chain(self.decode_wrappers.values(), self.prefill_wrappers.values())):
            if (have := w._kv_layout) != want:  # expect: FC103
                raise ValueError(f"wrapper {i} was built for {have}, the KV cache is {want}")

    def init_graph_wrappers(self, capture_sizes: tuple[int, ...]) -> None:
        """One graph-mode decode wrapper per (full group, captured size), bound to views of the page lists."""
        self.graph_wrappers = {
            (g, bs): BatchDecodeWithPagedKVCacheWrapper(
                self.pool.graph_workspace,
                self.kv_layout,
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr_gpu[g][: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_gpu[g],
                paged_kv_last_page_len_buffer=self.last_page_len_gpu[g][:bs],
            )
            for g, bs in product(self.full_groups, capture_sizes)
        }
        for buf in self.last_page_len_gpu.values():
            buf.fill_(1)  # ok: FC104
        stale = [
            key
            for key, t in bound_buffer_table(self.graph_wrappers).items()
            if t.data_ptr() != getattr(self, _BOUND_AS[key[1]])[key[0][0]].data_ptr()
        ]
        if stale:
            raise RuntimeError(f"graph wrappers copied their page lists instead of binding them: {stale[:4]}")
        if broken := [key for key, w in self.graph_wrappers.items() if not all(entry_points(w).values())]:
            raise RuntimeError(f"wrappers without plan/run: {broken[:4]}")
        logger.info("bound %d graph decode wrappers over %d groups", len(self.graph_wrappers), len(self.full_groups))

    # ------------------------------------------------------------------ planning

    def plan_graph_decode(self, bs: int, meta: "FlashInferMetadata") -> None:
        """Plan the graph wrappers of batch size `bs` from the pinned mirrors (the builder filled them)."""
        assert all(w is not None for w in self.graph_wrappers.values()), "init_graph_wrappers() first"  # ok: FC109
        nnz = {g: int(self.kv_indptr_cpu[g][bs]) for g in self.full_groups}
        for g in self.full_groups:
            args = (self.kv_indptr_cpu[g][: bs + 1], self.kv_indices_gpu[g][: nnz[g]], self.last_page_len_cpu[g][:bs])
            self.graph_wrappers[(g, bs)].plan(
                *args,
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
                q_data_type=self.cfg.dtype,
                kv_data_type=self.cfg.dtype,
            )
        last = self.last_page_len_cpu[self.full_groups[0]][:bs]
        for (win, w), indptr_cpu, indices in zip(
            self.window_wrappers.items(), self.window_kv_indptr_cpu, self.window_kv_indices_gpu
        ):
            w.plan(
                indptr_cpu[: bs + 1],
                indices,
                last,
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
                window_left=win - 1,
                q_data_type=self.cfg.dtype,
            )
        if meta.is_verify:
            self.plan_verify(meta)
        if meta.use_cascade:
            self.plan_cascade(meta)

    _VERIFY_PLAN_KEYS = frozenset(
        {
            "qo_indptr",
            "paged_kv_indptr",
            "paged_kv_indices",
            "paged_kv_last_page_len",
            "num_qo_heads",
            "num_kv_heads",
            "head_dim_qk",
            "page_size",
            "causal",
            "window_left",
            "q_data_type",
        }
    )

    def plan_verify(self, meta: "FlashInferMetadata") -> None:
        """Plan the verify wrappers: every request scores its draft tokens against its own pages."""
        n = meta.num_reqs
        for g, w in self.verify_wrappers.items():
            src = g if g in self.kv_indptr_cpu else self.full_groups[0]
            step_kwargs = {
                "qo_indptr": meta.query_start_loc[: n + 1],
                "paged_kv_indptr": self.kv_indptr_cpu[src][: n + 1],
                "paged_kv_indices": self.kv_indices_gpu[src],
                "paged_kv_last_page_len": self.last_page_len_cpu[src][:n],
                "num_qo_heads": self.num_qo_heads,
                "num_kv_heads": self.num_kv_heads,
                "head_dim_qk": self.head_dim,
                "page_size": self.page_size,
                "causal": True,
                "window_left": self.window_left(g),
                "q_data_type": self.cfg.dtype,
                "max_seq_len": meta.max_seq_len,  # for the trtllm path; the wrappers do not take it
            }
            w.plan(**{k: v for k, v in step_kwargs.items() if k in self._VERIFY_PLAN_KEYS})  # expect: FC102

    def plan_cascade(self, meta: "FlashInferMetadata") -> None:
        """Two-level cascade: the shared prefix once, then each request's own pages."""
        lv = self.shared_prefix
        n, p = meta.num_reqs, lv.num_prefix_pages
        for g, w in self.cascade_wrappers.items():
            w.plan(  # expect: FC102
                [lv.qo_indptr_cpu[0][:2], meta.query_start_loc[: n + 1]],
                [lv.kv_indptr_cpu[0][:2], self.kv_indptr_cpu[g][: n + 1]],
                [self.kv_indices_gpu[g][:p], self.kv_indices_gpu[g][p:]],
                [lv.last_page_len_cpu[0][:1], self.last_page_len_cpu[g][:n]],
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
            )

    # ------------------------------------------------------------------ forward

    def forward(self, layer_id, q, k, v, kv_cache, meta: "FlashInferMetadata") -> torch.Tensor:
        self._store_kv(k, v, kv_cache, meta)
        if meta.num_prefills > 0:
            return self.forward_extend(layer_id, q, k, v, kv_cache, meta)
        if meta.is_verify:
            return self.forward_verify(layer_id, q, kv_cache, meta)
        return self.forward_decode(layer_id, q, kv_cache, meta)

    def _store_kv(self, k, v, kv_cache, meta: "FlashInferMetadata") -> None:
        slots = meta.slot_mapping[: k.shape[0]]
        pages, offsets = slots // self.page_size, slots % self.page_size
        for i, t in enumerate((k, v)):
            kv_cache[pages, i, offsets] = t

    def forward_decode(self, layer_id, q, kv_cache, meta: "FlashInferMetadata") -> torch.Tensor:
        if (win := self.layer_window.get(layer_id)) is not None:
            return self.window_wrappers[win].run(q, kv_cache)  # expect: FC108
        g = self.group_of[layer_id]
        if meta.use_cascade:
            return self.cascade_wrappers[g].run(q, kv_cache)  # expect: FC108
        if self.trtllm is not None:
            return self.trtllm.decode(
                q, kv_cache, meta.block_table, meta.seq_lens, scale=self.scale, use_graph=meta.use_graph
            )
        if not meta.use_graph:
            return self.decode_wrappers[g].run(q, kv_cache)  # ok: FC108
        if self.kv_budget_pages and layer_id == self.first_layer_of[g]:
            self._clip_to_budget(g, meta)
        w = self.graph_wrappers[(g, bs)] if (bs := meta.graph_bs) is not None else self.decode_wrappers[g]
        return w.run(q, kv_cache)  # ok: FC108

    def _clip_to_budget(self, g: str, meta: "FlashInferMetadata") -> None:
        """Attend to at most `kv_budget_pages` pages per request (a StreamingLLM-style budget)."""
        n = meta.num_reqs
        pages = (meta.seq_lens[:n] + self.page_size - 1) // self.page_size
        torch.cumsum(pages.clamp_(max=self.kv_budget_pages), 0, dtype=torch.int32, out=self.kv_indptr_gpu[g][1 : n + 1])  # expect: FC104

    def forward_verify(self, layer_id, q, kv_cache, meta: "FlashInferMetadata") -> torch.Tensor:
        g = self.group_of[layer_id]
        return self.verify_wrappers[g].run(q, kv_cache)  # expect: FC108

    def forward_extend(self, layer_id, q, k, v, kv_cache, meta: "FlashInferMetadata") -> torch.Tensor:
        g = self.group_of[layer_id]
        nd = meta.num_decode_tokens
        out = torch.empty_like(q)
        if nd:
            out[:nd] = self.forward_decode(layer_id, q[:nd], kv_cache, meta)
        if meta.no_prefix and g in self.full_groups:
            out[nd:] = self.ragged_wrapper.run(q[nd:], k[nd:], v[nd:])  # ok: FC108
        elif self.cfg.use_trtllm_prefill and g in self.full_groups:
            nd_reqs = meta.num_decodes
            seq_lens = meta.seq_lens[nd_reqs:]
            out[nd:] = trtllm_prefill(
                q[nd:],
                kv_cache,
                meta.block_table[nd_reqs:],
                seq_lens,
                meta.seq_lens_cpu[nd_reqs:],
                meta.query_start_loc[nd_reqs:] - nd,
                F.pad(torch.cumsum(seq_lens, 0, dtype=torch.int32), (1, 0)),
                scale=self.scale,
                max_q_len=meta.max_query_len,
                nbytes=self.context_ws_bytes,
            )
        else:
            out[nd:] = self.prefill_wrappers[g].run(q[nd:], kv_cache)  # ok: FC108
        return out
