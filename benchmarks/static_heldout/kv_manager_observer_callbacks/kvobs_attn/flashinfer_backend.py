"""FlashInfer attention backend that observes the KV block manager (page frees, aborts, compaction)."""
import logging
import os
import types
from typing import Dict, List, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper, merge_state
from flashinfer.decode import fast_decode_plan, trtllm_batch_decode_with_kv_cache

from kvobs import DECODE_BUCKETS, PAGE_SIZE, PREFILL_WS_MB, ServerConfig, WsSize
from kvobs.block_manager import BlockManager
from kvobs_attn.kernels import remap_pages, trtllm_workspace
from kvobs_sched.scheduler import ForwardBatch

logger = logging.getLogger(__name__)


def _decode_kwargs(cfg: ServerConfig) -> dict:
    kw = {"use_tensor_cores": cfg.num_heads // cfg.num_kv_heads >= 4}
    if cfg.use_trtllm_decode:
        kw["backend"] = "trtllm-gen"
    return kw


def make_window_wrapper(device: torch.device) -> BatchDecodeWithPagedKVCacheWrapper:
    ws = torch.empty(int(os.getenv("KVOBS_WINDOW_WS_MB", "64")) << 20, dtype=torch.uint8, device=device)  # expect: FC106
    return BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", backend="fa2")


def _describe(self) -> str:  # installed on every graph wrapper for the page-table dump
    return f"{type(self).__name__}(layout={self._kv_layout})"  # expect: FC103


class SharedPrefix:
    """The system prompt's pages: attended once per step by their own wrapper, merged by LSE."""

    def __init__(self, cfg: ServerConfig, device: torch.device):
        self.cfg = cfg
        self.workspace = torch.zeros(cfg.decode_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.wrapper = BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        self.pages_gpu = torch.arange(1, cfg.shared_prefix_pages + 1, dtype=torch.int32, device=device)

    def plan(self, n: int) -> None:
        kv_indptr_gpu = torch.arange(n + 1, dtype=torch.int32, device=self.pages_gpu.device) * self.pages_gpu.numel()
        self.wrapper.plan(  # expect: FC102
            torch.arange(n + 1, dtype=torch.int32), kv_indptr_gpu, self.pages_gpu.repeat(n), torch.full((n,), PAGE_SIZE, dtype=torch.int32),
            self.cfg.num_heads, self.cfg.num_kv_heads, self.cfg.head_dim, PAGE_SIZE, causal=False)


class FlashInferAttnBackend:
    GRAPH_WS_BYTES = WsSize.GRAPH

    def __init__(self, cfg: ServerConfig, device: torch.device, bm: BlockManager):
        self.cfg, self.device, self.bm, self.max_bs = cfg, device, bm, max(DECODE_BUCKETS)
        self._kv_layout = "NHD"  # ok: FC103
        self._plan_info: Dict[str, int] = {}
        self.heads = dict(num_qo_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, page_size=PAGE_SIZE)
        self.decode_ws = torch.empty(cfg.decode_workspace_bytes, dtype=torch.uint8, device=device)  # expect: FC105
        self.prefill_ws = torch.empty(PREFILL_WS_MB << 20, dtype=torch.uint8, device=device)  # expect: FC106
        self.ragged_ws = torch.zeros(WsSize.RAGGED, dtype=torch.uint8, device=device)  # expect: FC106
        self.graph_ws = torch.empty(self.GRAPH_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.long_ws = torch.empty(cfg.max_running * cfg.num_heads * cfg.head_dim * 64, dtype=torch.uint8, device=device)  # ok: FC105
        self.long_ws.zero_()
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_ws, "NHD", **_decode_kwargs(cfg))
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, "NHD")
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.ragged_ws, "NHD")
        self.window_wrapper = make_window_wrapper(device)
        self.draft_wrapper = BatchDecodeWithPagedKVCacheWrapper(trtllm_workspace(device, 2 * cfg.decode_workspace_bytes), "NHD", backend="trtllm-gen")
        self.prefix = SharedPrefix(cfg, device) if cfg.shared_prefix_pages else None
        self._fast_plan = fast_decode_plan
        # bound to the graph-mode decode wrappers (a view per bucket), and the pinned mirror of the indptr
        self.kv_indptr = torch.zeros(self.max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(self.max_bs * cfg.max_context // PAGE_SIZE, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.empty(self.max_bs, dtype=torch.int32, device=device)
        self.kv_last_page_len.fill_(1)  # ok: FC104
        self.graph_bufs = {"kv_indptr": self.kv_indptr, "kv_indices": self.kv_indices, "kv_last_page_len": self.kv_last_page_len}
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.kv_indptr_host = torch.zeros(self.max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.page_in_use_host = torch.zeros(cfg.num_pages, dtype=torch.bool, pin_memory=True)
        self.freed_log_cpu = torch.zeros(0, dtype=torch.int32)
        self.qo_indptr_buf = torch.zeros(cfg.max_running + 1, dtype=torch.int32, device=device)
        self.extend_prefix_lens: Optional[torch.Tensor] = None
        self.long_seq_lens: Optional[torch.Tensor] = None
        self.long_block_tables: Optional[torch.Tensor] = None
        self.long_rows: List[int] = []
        self.max_seq_len, self.window_active, self.extend_uses_ragged = 0, False, True
        self.kv_caches = [torch.zeros(cfg.num_pages, 2, PAGE_SIZE, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers + cfg.num_draft_layers)]
        bm.pages_freed.add(self.on_pages_freed)
        bm.request_aborted.add(self.on_request_aborted, weak=True)
        bm.compacted.add(self.on_compaction)

    @property
    def graph_indptr(self) -> torch.Tensor:
        return self.kv_indptr

    def init_cuda_graph_state(self) -> None:
        self.kv_indices.zero_()  # ok: FC104
        for bs in DECODE_BUCKETS:
            w = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices, paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs])
            if not hasattr(w, "_fixed_batch_size"):  # expect: FC103
                raise RuntimeError("this FlashInfer build has no fixed-batch graph-mode decode")
            w.describe = types.MethodType(_describe, w)
            self.graph_wrappers[bs] = w

    # -- per step ------------------------------------------------------------------------------
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        assert fb.batch_size <= self.cfg.max_running  # expect: FC109
        if fb.seq_lens_cpu.max() > self.cfg.max_context:  # ok: FC101
            raise ValueError(f"sequence longer than max_context={self.cfg.max_context}: {fb.seq_lens}")  # ok: FC101
        if not self.bm.copy_stream.query():  # ok: FC101
            self.bm.copy_stream.synchronize()  # expect: FC101
        if fb.forward_mode.is_decode():  # ok: FC101
            self._plan_decode(fb)
        else:
            self._plan_extend(fb)

    def _plan_decode(self, fb: ForwardBatch) -> None:
        self.max_seq_len = int(max(fb.seq_lens))  # expect: FC101
        self.window_active = self.max_seq_len > self.cfg.sliding_window
        self.long_rows = [i for i in range(fb.batch_size) if fb.seq_lens[i] > self.cfg.max_context // 2]  # expect: FC101
        self.long_seq_lens = fb.seq_lens.clone()  # expect: FC107
        self.long_block_tables = fb.block_tables
        self.decode_wrapper.begin_forward(fb.kv_indptr, fb.kv_indices, fb.kv_last_page_len_cpu, logits_soft_cap=self.cfg.logits_soft_cap, **self.heads)  # expect: FC102
        win_pages = torch.clamp(fb.kv_indptr.diff(), max=self.cfg.sliding_window // PAGE_SIZE + 1)
        fb.win_kv_indptr = torch.cat([fb.kv_indptr[:1], torch.cumsum(win_pages, 0, dtype=torch.int32)])  # ok: FC107
        self.window_wrapper.plan(fb.win_kv_indptr, fb.kv_indices, fb.kv_last_page_len_cpu, window_left=self.cfg.sliding_window - 1, **self.heads)  # expect: FC102
        if self.cfg.num_draft_layers:
            self.draft_wrapper.plan(**dict(indptr=fb.kv_indptr_cpu, indices=fb.kv_indices, last_page_len=fb.kv_last_page_len, **self.heads))  # expect: FC102
        if self.prefix is not None:
            self.prefix.plan(fb.batch_size)

    def _plan_extend(self, fb: ForwardBatch) -> None:
        n = fb.batch_size
        prefix_rows = [i for i, (s, e) in enumerate(zip(fb.seq_lens_cpu.tolist(), fb.extend_lens_cpu.tolist())) if s > e]  # ok: FC101
        self.extend_uses_ragged = not prefix_rows
        if self.qo_indptr_buf.numel() < n + 1:
            self.qo_indptr_buf = torch.empty(2 * n + 1, dtype=torch.int32, device=self.device)  # expect: FC107
        if self.extend_prefix_lens is None:
            self.extend_prefix_lens = torch.zeros(self.cfg.max_running, dtype=torch.int32, device=self.device)  # ok: FC107
        self.extend_prefix_lens.resize_(n)  # expect: FC107
        torch.sub(fb.seq_lens, fb.extend_lens, out=self.extend_prefix_lens)
        fb.token_rows = torch.repeat_interleave(fb.rows, fb.extend_lens)  # expect: FC101
        self._plan_info["prefix_reqs"] = fb.rows[fb.seq_lens > fb.extend_lens].numel()  # expect: FC101
        self._plan_info["extend_tokens"] = sum(fb.extend_lens)  # expect: FC101
        if self.extend_uses_ragged:
            self.ragged_wrapper.plan(fb.qo_indptr, fb.qo_indptr, self.cfg.num_heads, self.cfg.num_kv_heads, self.cfg.head_dim, causal=True)  # expect: FC102
        else:
            self.prefill_wrapper.plan(  # ok: FC102
                fb.qo_indptr_cpu, fb.kv_indptr_cpu, fb.kv_indices, fb.kv_last_page_len_cpu, self.cfg.num_heads, self.cfg.num_kv_heads, self.cfg.head_dim, PAGE_SIZE, causal=True)

    # -- CUDA graphs ---------------------------------------------------------------------------
    def load_graph_inputs(self, fb: ForwardBatch, bs: int) -> None:
        n = fb.batch_size
        self.kv_indptr[: n + 1].copy_(fb.kv_indptr, non_blocking=True)
        self.kv_indptr[n + 1 : bs + 1] = fb.kv_indptr[n]
        self.kv_indices[: fb.kv_indptr[n]].copy_(fb.kv_indices, non_blocking=True)  # expect: FC101
        self.kv_last_page_len[:n].copy_(fb.kv_last_page_len, non_blocking=True)

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        self.kv_indptr_host[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_host[: bs + 1])  # ok: FC104
        self._plan_info["capture_pages"] = int(self.kv_indptr_host[bs])  # ok: FC101
        indptr, indices, last = self.kv_indptr_host[: bs + 1], self.kv_indices[:bs], torch.ones(bs, dtype=torch.int32)
        self.window_wrapper.plan(indptr, indices, last, window_left=self.cfg.sliding_window - 1, **self.heads)  # ok: FC102
        self.draft_wrapper.plan(indptr, indices, last, **self.heads)  # ok: FC102
        self._fast_plan(self.graph_wrappers[bs], indptr, indices, last, **self.heads)  # ok: FC102
        if self.prefix is not None:
            self.prefix.plan(bs)
        self.window_active = bool(self.cfg.window_layers)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        n = fb.batch_size
        logger.debug("replay bs=%d seq_lens=%s", bs, fb.seq_lens)  # ok: FC101
        self.max_seq_len = int(fb.seq_lens_cpu.max())  # ok: FC101
        self.load_graph_inputs(fb, bs)  # ok: FC104
        nnz = self.kv_indptr[n].item()  # expect: FC101
        self.kv_indptr_host.copy_(self.kv_indptr)  # expect: FC101
        self.window_wrapper.plan(self.kv_indptr_host[: n + 1], fb.kv_indices, fb.kv_last_page_len_cpu, window_left=self.cfg.sliding_window - 1, **self.heads)  # ok: FC102
        self.draft_wrapper.plan(self.kv_indptr_host[: n + 1], fb.kv_indices, fb.kv_last_page_len_cpu, **self.heads)  # ok: FC102
        if self.prefix is not None:
            self.prefix.plan(n)
        self._fast_plan(self.graph_wrappers[bs], self.kv_indptr[: bs + 1], self.kv_indices[:nnz], self.kv_last_page_len[:bs], **self.heads)  # expect: FC102
        self.kv_last_page_len[n:bs].fill_(1)  # expect: FC104
        self.kv_indptr_host[n + 1 :] = nnz  # ok: FC104

    # -- attention -----------------------------------------------------------------------------
    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer) -> torch.Tensor:
        if self.extend_uses_ragged:
            return self.ragged_wrapper.run(q, k, v)  # ok: FC108
        return self.prefill_wrapper.run(q, self.kv_caches[layer.layer_id])  # ok: FC108

    def forward_decode(self, q: torch.Tensor, layer, graph_bs: Optional[int] = None) -> torch.Tensor:
        kv = self.kv_caches[layer.layer_id]
        if layer.is_draft:
            return self.draft_wrapper.run(q, kv)  # expect: FC108
        if self.window_active and layer.layer_id in self.cfg.window_layers:
            return self.window_wrapper.run(q, kv)  # expect: FC108
        if layer._logits_soft_cap:  # ok: FC103
            return self.decode_wrapper.run(q, kv)  # expect: FC108
        if graph_bs is None and self.long_rows:  # ok: FC101
            return trtllm_batch_decode_with_kv_cache(q, kv, self.long_ws, self.long_block_tables, self.long_seq_lens, self.max_seq_len)
        w = self.decode_wrapper if graph_bs is None else self.graph_wrappers[graph_bs]
        if self.prefix is None:
            return w.run(q, kv)  # ok: FC108
        o_prefix, lse_prefix = self.prefix.wrapper.run_return_lse(q, kv)  # expect: FC108
        o_suffix, lse_suffix = w.run(q, kv, return_lse=True)  # ok: FC108
        return merge_state(o_prefix, lse_prefix, o_suffix, lse_suffix)[0]

    # -- block-manager observers (run on the scheduler thread, between steps or during one) -----
    def on_pages_freed(self, pages: List[int]) -> None:
        self.page_in_use_host[pages] = False  # ok: FC104
        self.freed_log_cpu = torch.cat([self.freed_log_cpu, torch.tensor(pages, dtype=torch.int32)])  # ok: FC107
        freed = torch.tensor(pages, dtype=torch.int32, device=self.device)
        self.kv_indices.masked_fill_(torch.isin(self.kv_indices, freed), 0)  # expect: FC104

    def on_request_aborted(self, rid: str, row: int, num_pages: int) -> None:
        assert 0 <= row < self.cfg.max_running  # expect: FC109
        self.kv_indptr[row + 1 :] -= num_pages  # expect: FC104

    def on_compaction(self, remap: torch.Tensor) -> None:
        remap_dev = remap.to(self.device, non_blocking=True)
        with torch.cuda.stream(self.bm.copy_stream):
            for cache in self.kv_caches:
                cache.index_copy_(0, remap_dev.long(), cache.clone())
        if self.prefix is not None:
            remap_pages(self.prefix.pages_gpu, remap_dev, self.prefix.pages_gpu.numel())  # ok: FC104
        moved = int((remap_dev != torch.arange(remap_dev.numel(), device=self.device)).sum())  # ok: FC101
        stale = [bs for bs, w in self.graph_wrappers.items() if w._paged_kv_indices_buf.data_ptr() != self.kv_indices.data_ptr()]  # expect: FC103
        logger.info("compaction moved %d pages; %d graph wrappers lost their index buffer", moved, len(stale))

    def stats(self) -> Dict[str, object]:
        out: Dict[str, object] = dict(self._plan_info)  # ok: FC103
        out["prefill_plan"] = getattr(self.prefill_wrapper, "_plan_info", None)  # expect: FC103
        out["decode_module"] = self.decode_wrapper._cached_module  # expect: FC103
        out["int_ws"] = {bs: vars(w)["_int_workspace_buffer"].numel() for bs, w in self.graph_wrappers.items()}  # expect: FC103
        out["graph_enabled"] = [w.is_cuda_graph_enabled for w in self.graph_wrappers.values()]  # ok: FC103
        out["legacy_plan_api"] = hasattr(self.decode_wrapper, "begin_forward")  # ok: FC103
        out["pages"] = self.kv_indices.clone().clamp_(min=0).unique().numel()  # ok: FC104
        out["seq_lens"] = self.long_seq_lens.cpu() if self.long_seq_lens is not None else None  # ok: FC101
        return out
