"""FlashInfer attention over positional step records.

The backend never sees a metadata object: ``init_forward_metadata`` takes the
9-slot record built by ``records.make_meta`` and plans straight from its slots,
and every captured batch size keeps its buffers and wrapper in one list of
``graph_state`` (indexed with the ``BUF_*`` slots).
"""

from __future__ import annotations

import logging
from typing import Optional

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    append_paged_kv_cache,
    get_batch_indices_positions,
    merge_state,
)

from ..config import (
    WORKSPACE_TIERS,
    WS_DECODE,
    EngineConfig,
    graph_workspace_bytes,
    prefill_workspace_bytes,
)
from ..records import host_view
from ..slots import (
    BATCH_SIZE,
    BUF_INDICES,
    BUF_INDPTR,
    BUF_LAST_PAGE,
    BUF_WRAPPER,
    DEV,
    KV_INDICES,
    KV_INDPTR,
    KV_LAST_PAGE_LEN,
    MODE,
    NUM_TOKENS,
    QO_INDPTR,
    SEQ_LENS,
)
from .trtllm_decode import TrtllmDecodePath

logger = logging.getLogger(__name__)

# eager wrappers, by slot of ``self.wrappers`` / ``self.window_wrappers``
W_DECODE = 0
W_PREFILL = 1
W_PREFIX = 2


class FlashInferTupleBackend:
    def __init__(self, cfg: EngineConfig, device: torch.device, kv_caches: list[torch.Tensor]):
        self.cfg = cfg
        self.device = device
        self.kv_caches = kv_caches
        self.page_size = cfg.page_size
        # positional tail of every plan() call: num_qo_heads, num_kv_heads, head_dim, page_size
        self.geometry = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)
        self.window_pages = cfg.window_pages
        self._kv_layout = "HND"
        self._use_cuda_graph = cfg.enable_cuda_graph
        self._plan_info: Optional[tuple] = None  # (bs, num_pages, mode) of the last eager plan
        self.max_seq_len = 0
        sm_major = torch.cuda.get_device_capability(device)[0]

        decode_ws = torch.zeros(WORKSPACE_TIERS[WS_DECODE], dtype=torch.uint8, device=device)  # expect: FC106
        prefill_ws = torch.zeros(prefill_workspace_bytes(cfg), dtype=torch.uint8, device=device)  # ok: FC106
        prefix_ws = torch.empty(prefill_workspace_bytes(cfg) // 4, dtype=torch.uint8, device=device)  # ok: FC105
        window_ws = torch.empty(cfg.window_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.workspaces = (decode_ws, prefill_ws, prefix_ws, window_ws)

        tensor_cores = cfg.gqa_group_size >= 4
        self.wrappers = (
            BatchDecodeWithPagedKVCacheWrapper(decode_ws, self._kv_layout, use_tensor_cores=tensor_cores),
            BatchPrefillWithPagedKVCacheWrapper(prefill_ws, self._kv_layout),
            BatchPrefillWithPagedKVCacheWrapper(prefix_ws, self._kv_layout),
        )
        window_backend = "trtllm-gen" if sm_major >= 10 else "fa2"
        self.window_wrappers = (
            BatchDecodeWithPagedKVCacheWrapper(window_ws, self._kv_layout, backend=window_backend),
            BatchPrefillWithPagedKVCacheWrapper(prefill_ws, self._kv_layout),
        )
        self.trtllm = TrtllmDecodePath(cfg, device) if cfg.use_trtllm_decode else None

        # shared system prompt (cascade level 0), set by set_shared_prefix()
        self.prefix_pages: Optional[torch.Tensor] = None
        self.prefix_kv_indptr: Optional[torch.Tensor] = None
        self.prefix_last_page_len: Optional[torch.Tensor] = None

        # captured decode buckets: graph_state[bs] is a BUF_* list, or None
        self.graph_workspace = torch.zeros(graph_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC106
        self.graph_state: list[Optional[list]] = [None] * (cfg.max_batch_size + 1)
        self.graph_kv_indices: Optional[torch.Tensor] = None
        self.graph_qo_indptr: Optional[torch.Tensor] = None
        self.graph_seq_lens: Optional[torch.Tensor] = None

    # ------------------------------------------------------------------ setup

    def graphs_enabled(self) -> bool:
        return self._use_cuda_graph  # ok: FC103

    def set_shared_prefix(self, page_ids: list[int], last_page_len: int) -> None:
        """Pin a system prompt's pages; every query of a step attends to them first."""
        if not page_ids:
            self.prefix_pages = self.prefix_kv_indptr = self.prefix_last_page_len = None
            return
        self.prefix_pages = torch.tensor(page_ids, dtype=torch.int32, device=self.device)
        self.prefix_kv_indptr = torch.tensor([0, len(page_ids)], dtype=torch.int32, device=self.device)
        self.prefix_last_page_len = torch.tensor([last_page_len], dtype=torch.int32)

    # -------------------------------------------------------------- per step

    def init_forward_metadata(self, meta: tuple) -> None:
        mode = meta[MODE]
        hv = host_view(meta)
        if mode == "decode":
            self._plan_decode(hv)
            if self.cfg.sliding_window > 0:
                self._plan_window(meta)
            if self.trtllm is not None:
                self.trtllm.prepare(meta)
        else:
            self._plan_extend(meta)
        if self.prefix_pages is not None:
            self._plan_prefix(meta)
        _seq_lens_d, seq_lens_h = meta[SEQ_LENS]
        self.max_seq_len = int(seq_lens_h.max())  # ok: FC101
        num_pages = int(hv[KV_INDPTR][-1])
        self._plan_info = (meta[BATCH_SIZE], num_pages, mode)  # ok: FC103

    def _plan_decode(self, hv: tuple) -> None:
        args = hv[KV_INDPTR : KV_LAST_PAGE_LEN + 1] + self.geometry
        self.wrappers[W_DECODE].plan(*args, q_data_type=self.cfg.dtype)  # ok: FC102

    def _clip_to_window(self, meta: tuple) -> tuple:
        """Drop the pages a sliding-window layer can no longer see.

        Returns the record with its page slots replaced, so that the split-k planner
        balances on the pages the window layers actually read.
        """
        kv_indices, _last_pair, seq_pair = meta[2:5]
        if not bool((seq_pair[DEV] > self.cfg.sliding_window).any()):  # expect: FC101
            return meta
        _, kv_indptr_h = meta[KV_INDPTR]
        ptr = kv_indptr_h.numpy()
        keep = np.minimum(ptr[1:] - ptr[:-1], self.window_pages)
        new_ptr = np.zeros_like(ptr)
        np.cumsum(keep, out=new_ptr[1:])
        gather = np.concatenate([np.arange(end - k, end) for end, k in zip(ptr[1:], keep)])
        gather_d = torch.from_numpy(gather).to(self.device, non_blocking=True)
        new_ptr_h = torch.from_numpy(new_ptr).pin_memory()
        rec = list(meta)
        rec[KV_INDPTR] = (new_ptr_h.to(self.device, non_blocking=True), new_ptr_h)
        rec[KV_INDICES] = kv_indices[gather_d]
        return tuple(rec)

    def _plan_window(self, meta: tuple) -> None:
        wmeta = self._clip_to_window(meta)
        indptr_d, indptr_h = wmeta[KV_INDPTR]
        _, last_h = wmeta[KV_LAST_PAGE_LEN]
        self.window_wrappers[W_DECODE].plan(  # expect: FC102
            indptr_d,
            wmeta[KV_INDICES],
            last_h,
            *self.geometry,
            window_left=self.cfg.sliding_window - 1,
            q_data_type=self.cfg.dtype,
        )

    def _plan_extend(self, meta: tuple) -> None:
        hv = host_view(meta)
        # the ragged query layout is consumed on the device by the kernels anyway
        qo_indptr_d, _ = meta[QO_INDPTR]
        self.wrappers[W_PREFILL].plan(  # expect: FC102
            qo_indptr_d,
            *hv[KV_INDPTR : KV_LAST_PAGE_LEN + 1],
            *self.geometry,
            causal=True,
            q_data_type=self.cfg.dtype,
        )
        if self.cfg.sliding_window > 0:
            self.window_wrappers[W_PREFILL].plan(  # ok: FC102
                *hv[: KV_LAST_PAGE_LEN + 1],
                *self.geometry,
                causal=True,
                window_left=self.cfg.sliding_window - 1,
                q_data_type=self.cfg.dtype,
            )

    def _plan_prefix(self, meta: tuple) -> None:
        """Cascade level 0: all queries of the step against the shared prefix pages."""
        qo_h = torch.tensor([0, meta[NUM_TOKENS]], dtype=torch.int32)
        self.wrappers[W_PREFIX].plan(  # expect: FC102
            qo_h,
            self.prefix_kv_indptr,
            self.prefix_pages,
            self.prefix_last_page_len,
            *self.geometry,
            causal=False,
            q_data_type=self.cfg.dtype,
        )

    # --------------------------------------------------------------- forward

    def _append_kv(self, kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: tuple) -> None:
        qo_indptr_d, _ = meta[QO_INDPTR]
        seq_lens_d, _ = meta[SEQ_LENS]
        batch_ids, positions = get_batch_indices_positions(qo_indptr_d, seq_lens_d, meta[NUM_TOKENS])
        append_paged_kv_cache(
            k,
            v,
            batch_ids,
            positions,
            kv_cache,
            meta[KV_INDICES],
            meta[KV_INDPTR][DEV],
            meta[KV_LAST_PAGE_LEN][DEV],
            kv_layout=self._kv_layout,
        )

    def forward_decode(self, q, k, v, layer_id: int, meta: tuple) -> torch.Tensor:
        kv_cache = self.kv_caches[layer_id]
        self._append_kv(kv_cache, k, v, meta)
        if self.cfg.is_window_layer(layer_id):
            return self.window_wrappers[W_DECODE].run(q, kv_cache)  # expect: FC108
        if self.trtllm is not None:
            return self.trtllm.decode(q, kv_cache, meta)
        state = self.graph_state[meta[BATCH_SIZE]]
        w = state[BUF_WRAPPER] if state is not None else self.wrappers[W_DECODE]
        if self.prefix_pages is None:
            return w.run(q, kv_cache)  # ok: FC108
        o, lse = w.run(q, kv_cache, return_lse=True)
        o_prefix, lse_prefix = self.wrappers[W_PREFIX].run(q, kv_cache, return_lse=True)  # expect: FC108
        out, _ = merge_state(o_prefix, lse_prefix, o, lse)
        return out

    def forward_extend(self, q, k, v, layer_id: int, meta: tuple) -> torch.Tensor:
        kv_cache = self.kv_caches[layer_id]
        self._append_kv(kv_cache, k, v, meta)
        if self.cfg.is_window_layer(layer_id):
            return self.window_wrappers[W_PREFILL].run(q, kv_cache)
        if self.prefix_pages is None:
            return self.wrappers[W_PREFILL].run(q, kv_cache)  # ok: FC108
        o, lse = self.wrappers[W_PREFILL].run(q, kv_cache, return_lse=True)
        o_prefix, lse_prefix = self.wrappers[W_PREFIX].run(q, kv_cache, return_lse=True)  # ok: FC108
        out, _ = merge_state(o_prefix, lse_prefix, o, lse)
        return out

    # ---------------------------------------------------------- CUDA graphs

    def init_cuda_graph_state(self, max_bs: int) -> None:
        max_pages = max_bs * self.cfg.max_pages_per_req
        self.graph_kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=self.device)
        self.graph_qo_indptr = torch.arange(max_bs + 1, dtype=torch.int32, device=self.device)
        self.graph_seq_lens = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        for state in self.graph_state:  # buckets of an earlier capture
            if state is not None:
                state[BUF_LAST_PAGE].fill_(1)  # ok: FC104

    def _graph_meta(self, bs: int, state: list) -> tuple:
        """The record a bucket is captured with: its device slots are the bound buffers."""
        ones_h = torch.ones(bs, dtype=torch.int32)
        arange_h = torch.arange(bs + 1, dtype=torch.int32)
        return (
            (self.graph_qo_indptr[: bs + 1], arange_h),
            (state[BUF_INDPTR], arange_h),
            state[BUF_INDICES],
            (state[BUF_LAST_PAGE], ones_h),
            (self.graph_seq_lens[:bs], ones_h),
            None,  # positions: the graph runner's static buffer
            bs,
            bs,
            "decode",
        )

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> tuple:
        indptr = torch.arange(bs + 1, dtype=torch.int32, device=self.device)
        last_page = torch.ones(bs, dtype=torch.int32, device=self.device)
        wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace,
            self._kv_layout,
            use_cuda_graph=True,
            use_tensor_cores=self.cfg.gqa_group_size >= 4,
            paged_kv_indptr_buffer=indptr,
            paged_kv_indices_buffer=self.graph_kv_indices,
            paged_kv_last_page_len_buffer=last_page,
        )
        state = [indptr, self.graph_kv_indices, last_page, wrapper, None, None, None, None]
        self.graph_state[bs] = state
        meta = self._graph_meta(bs, state)
        state[BUF_INDICES][:bs].zero_()  # ok: FC104
        hv = host_view(meta)
        wrapper.plan(*hv[KV_INDPTR : KV_LAST_PAGE_LEN + 1], *self.geometry, q_data_type=self.cfg.dtype)  # ok: FC102
        return meta

    def refresh_bucket(self, bs: int, meta: tuple) -> None:
        """Fill bucket ``bs``'s bound buffers from a record padded to ``bs`` rows, then plan."""
        state = self.graph_state[bs]
        n = meta[BATCH_SIZE]
        kv_indptr_d, kv_indptr_h = meta[KV_INDPTR]
        total = int(kv_indptr_h[-1])  # ok: FC101
        if total > self.graph_kv_indices.numel():
            self.graph_kv_indices = torch.empty(2 * total, dtype=torch.int32, device=self.device)  # expect: FC107
        state[BUF_INDICES][:total].copy_(meta[KV_INDICES][:total], non_blocking=True)  # ok: FC104
        state[BUF_INDPTR][: n + 1].copy_(kv_indptr_d, non_blocking=True)  # ok: FC104
        if self.trtllm is not None:
            self.trtllm.prepare(meta)
        hv = host_view(meta)
        state[BUF_WRAPPER].plan(*hv[KV_INDPTR : KV_LAST_PAGE_LEN + 1], *self.geometry, q_data_type=self.cfg.dtype)  # ok: FC102
        state[BUF_LAST_PAGE][n:].fill_(1)  # expect: FC104
        seq_lens_d, _ = meta[SEQ_LENS]
        self.graph_seq_lens[:n].copy_(seq_lens_d, non_blocking=True)
        self.graph_seq_lens[n:bs].fill_(1)

    def graph_buffers(self, bs: int) -> tuple:
        """(kv_indptr, kv_indices, kv_last_page_len) bound to bucket ``bs``'s wrapper."""
        return tuple(self.graph_state[bs][:BUF_WRAPPER])

    # ----------------------------------------------------------------- debug

    def trace_bucket(self, bs: int) -> tuple:
        """What the bucket's wrapper last planned, for the debug endpoint."""
        state = self.graph_state[bs]
        if state is None:
            return ()
        return tuple(state[BUF_WRAPPER]._plan_info)  # expect: FC103

    def memory_report(self) -> dict[str, int]:
        report = {
            "float_workspaces": sum(ws.numel() for ws in self.workspaces),
            "graph_workspace": self.graph_workspace.numel(),
        }
        report["int_workspaces"] = sum(
            w._int_workspace_buffer.numel() for w in self.wrappers + self.window_wrappers  # expect: FC103
        )
        return report
