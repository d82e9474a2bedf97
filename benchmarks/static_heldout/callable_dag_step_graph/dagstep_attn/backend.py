import functools
import logging
import os
from typing import Dict, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper, merge_state
from flashinfer import trtllm_batch_context_with_kv_cache, trtllm_batch_decode_with_kv_cache

from dagstep.batch import StepBatch, StepContext
from dagstep.config import PAGE_SIZE, PREFILL_WS_BYTES, EngineConfig
from dagstep_attn.workspace import draft_workspace, get_trtllm_workspace, make_context_workspace, make_graph_workspace

logger = logging.getLogger(__name__)

_WS_FIELDS = ("_int_workspace_buffer", "_float_workspace_buffer")

def _pad_rows(buf: torch.Tensor, start: int, value: int) -> None:
    buf[start:] = value

class FlashInferBackend:
    RAGGED_WS_BYTES = 64 * 1024 * 1024

    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self._kv_layout = "NHD"
        self._plan_info: Dict[int, tuple] = {}
        self.graph_bs: Optional[int] = None
        h, kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.dims = (h, kv, d)
        self.prefill_ws = torch.zeros(PREFILL_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.ragged_ws = torch.empty(self.RAGGED_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.decode_ws = torch.empty(cfg.decode_ws_bytes, dtype=torch.uint8, device=device)  # expect: FC105
        self.tc_ws = torch.zeros(cfg.tc_ws_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.window_ws = torch.empty(cfg.max_num_seqs * h * (d + 1) * 4 * 32, dtype=torch.uint8, device=device)  # ok: FC105
        self.prefix_ws = torch.zeros(int(os.environ.get("DAG_PREFIX_WS", 32 << 20)), dtype=torch.uint8, device=device)  # expect: FC106
        self.merge_workspace = torch.zeros(cfg.max_num_tokens * h * (d + 1), dtype=torch.float32, device=device)  # ok: FC106
        self.ctx_ws = make_context_workspace(cfg, device)
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, "NHD")
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.ragged_ws, "NHD")
        decode_backend = "trtllm-gen" if cfg.use_trtllm else "fa2"
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_ws, "NHD", backend=decode_backend)
        self.tc_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.tc_ws, "NHD", use_tensor_cores=True)
        self.window_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.window_ws, "NHD")
        self.draft_wrapper = BatchDecodeWithPagedKVCacheWrapper(draft_workspace(device), "NHD")
        self.prefix_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefix_ws, "NHD")
        self._plan_draft = functools.partial(self.draft_wrapper.plan, num_qo_heads=h, num_kv_heads=kv, head_dim=d,
                                             page_size=PAGE_SIZE)
        self.prefix_pages = torch.arange(max(cfg.shared_prefix_len // PAGE_SIZE, 1), dtype=torch.int32, device=device)
        self.eager_indices = torch.zeros(cfg.max_num_seqs * 64, dtype=torch.int32, device=device)
        self.page_counts = torch.zeros(cfg.max_bucket, dtype=torch.int32, device=device)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.init_cuda_graph_state()
        self.g_indptr.zero_()  # ok: FC104

    def init_cuda_graph_state(self) -> None:
        max_bs = self.cfg.max_bucket
        assert max_bs <= self.cfg.max_num_seqs, "graph bucket above the batch limit"  # ok: FC109
        max_pages = self.cfg.max_num_seqs * (self.cfg.long_context // PAGE_SIZE)
        self.g_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.g_indices = torch.zeros(max_pages, dtype=torch.int32, device=self.device)
        self.g_last_page = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.indptr_pinned = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_pinned = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_bufs = {"indptr": self.g_indptr, "indices": self.g_indices, "last_page": self.g_last_page}
        self.graph_ws = make_graph_workspace(self.cfg, self.device)
        self._float_workspace_buffer = self.graph_ws
        for bs in self.cfg.graph_buckets:
            w = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=self.g_indptr[: bs + 1],
                paged_kv_indices_buffer=self.g_indices, paged_kv_last_page_len_buffer=self.g_last_page[:bs],
            )
            setattr(w, "_fixed_batch_size", bs)  # expect: FC103
            self.graph_wrappers[bs] = w
        self.g_last_page.fill_(1)  # ok: FC104

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        h, kv, d = self.dims
        n_pages = int(self.g_indptr[bs])  # expect: FC101
        w = self.graph_wrappers[bs]
        w.plan(self.g_indptr[: bs + 1], self.g_indices[: max(n_pages, 1)], self.g_last_page[:bs], h, kv, d, PAGE_SIZE)  # expect: FC102
        self.graph_bs = bs

    def _stage_indices(self, batch: StepBatch) -> None:
        n_idx = batch.kv_indices.numel()
        self.g_indices[:n_idx].copy_(batch.kv_indices, non_blocking=True)  # ok: FC104

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: StepBatch) -> None:
        h, kv, d = self.dims
        n = batch.num_seqs
        assert n <= bs, "bucket too small"  # expect: FC109
        self._stage_indices(batch)
        self.indptr_pinned[: n + 1].copy_(batch.kv_indptr_cpu)
        self.indptr_pinned[n + 1 : bs + 1] = batch.kv_indptr_cpu[-1]
        self.last_page_pinned[:n].copy_(batch.last_page_len_cpu)
        self.last_page_pinned[n:bs] = 1
        self.g_indptr[: bs + 1].copy_(self.indptr_pinned[: bs + 1], non_blocking=True)  # ok: FC104
        self.g_last_page[:n].copy_(batch.last_page_len, non_blocking=True)  # ok: FC104
        w = self.graph_wrappers[bs]
        w.plan(self.indptr_pinned[: bs + 1], self.g_indices, self.last_page_pinned[:bs], h, kv, d, PAGE_SIZE)  # ok: FC102
        self.g_last_page[n:bs].fill_(1)  # expect: FC104
        bufs = self.graph_bufs
        bufs["indices"][int(batch.kv_indptr_cpu[-1]) :].zero_()  # expect: FC104
        self.indptr_pinned[bs + 1 :] = 0  # ok: FC104
        prev = self._plan_info.get(bs)  # ok: FC103
        self._plan_info[bs] = (n, prev[1] + 1 if prev else 1)
        self.graph_bs = bs

    def plan_step(self, ctx: StepContext) -> None:
        b = ctx.batch
        h, kv, d = self.dims
        assert b.num_seqs <= self.cfg.max_num_seqs  # expect: FC109
        kv_total = int(b.kv_indptr_cpu[-1])  # ok: FC101
        self.graph_bs = None
        if b.is_prefill:  # ok: FC101
            max_q = b.query_lens.max().item()  # expect: FC101
            longest = b.seq_lens_cpu.max().item()  # ok: FC101
            logger.debug("prefill plan: max_q=%d longest=%d pages=%d", max_q, longest, kv_total)
            self.ragged_wrapper.plan(b.query_start_loc, b.query_start_loc, h, kv, d, causal=True)  # expect: FC102
            self.prefill_wrapper.plan(  # ok: FC102
                b.query_start_loc_cpu, b.kv_indptr_cpu, b.kv_indices, b.last_page_len_cpu, h, kv, d, PAGE_SIZE, causal=True
            )
            if self.cfg.shared_prefix_len:
                self._plan_prefix(b)
            return
        if self.cfg.use_tensor_cores and b.num_seqs >= 8:
            self.tc_wrapper.plan(b.kv_indptr, b.kv_indices, b.last_page_len_cpu, h, kv, d, PAGE_SIZE)  # expect: FC102
        else:
            self.decode_wrapper.plan(b.kv_indptr_cpu, b.kv_indices, b.last_page_len_cpu, h, kv, d, PAGE_SIZE)  # ok: FC102
        self.window_wrapper.plan(  # expect: FC102
            **dict(indptr=b.kv_indptr_cpu, indices=b.kv_indices, last_page_len=b.last_page_len, num_qo_heads=h,
                   num_kv_heads=kv, head_dim=d, page_size=PAGE_SIZE, window_left=self.cfg.window)
        )
        self._plan_draft(b.kv_indptr, b.kv_indices, b.last_page_len_cpu)  # expect: FC102

    def plan_draft_step(self, batch: StepBatch) -> None:
        h, kv, d = self.dims
        self._plan_draft(batch.kv_indptr_cpu, batch.kv_indices, batch.last_page_len_cpu)  # ok: FC102
        self.window_wrapper.plan(  # ok: FC102
            batch.kv_indptr_cpu, batch.kv_indices, batch.last_page_len_cpu, h, kv, d, PAGE_SIZE, window_left=self.cfg.window
        )

    def _plan_prefix(self, b: StepBatch) -> None:
        h, kv, d = self.dims
        n_tok = int(b.query_lens_np.sum())
        pre_qo = torch.tensor([0, n_tok], dtype=torch.int32)
        pre_indptr = torch.tensor([0, self.prefix_pages.numel()], dtype=torch.int32)
        pre_last = torch.tensor([PAGE_SIZE], dtype=torch.int32)
        self.prefix_qo = torch.zeros(2, dtype=torch.int32, device=self.device)  # expect: FC107
        self.prefix_wrapper.plan(pre_qo, pre_indptr, self.prefix_pages, pre_last.cuda(), h, kv, d, PAGE_SIZE, causal=False)  # expect: FC102

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, window: bool, draft: bool) -> torch.Tensor:
        bs = q.shape[0]
        if draft:
            return self.draft_wrapper.run(q, kv_cache)  # expect: FC108
        if window:
            return self.window_wrapper.run(q, kv_cache)  # expect: FC108
        if bs == 1 and not self.cfg.use_trtllm:
            return self.decode_wrapper.run(q, kv_cache)  # expect: FC108
        w = self.decode_wrapper if self.graph_bs is None else self.graph_wrappers[self.graph_bs]
        out = w.run(q, kv_cache)  # ok: FC108
        if self.cfg.shared_prefix_len:
            pre_out, pre_lse = self.prefix_wrapper.run_return_lse(q, kv_cache)  # expect: FC108
            out, _ = merge_state(pre_out, pre_lse, out, torch.zeros_like(pre_lse))
        return out

    def forward_graph_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        return self.graph_wrappers[bs].run(q, kv_cache)  # ok: FC108

    def forward_extend(self, q, k, v, kv_cache, block_tables, seq_lens, sm_scale: float) -> torch.Tensor:
        if seq_lens.shape[0] == 1 and k.shape[0] > self.cfg.long_context:
            return trtllm_batch_context_with_kv_cache(q, kv_cache, self.ctx_ws, block_tables, seq_lens, sm_scale)
        if self.cfg.shared_prefix_len == 0:
            return self.ragged_wrapper.run(q, k, v)  # ok: FC108
        return self.prefill_wrapper.run(q, kv_cache)  # ok: FC108

    def forward_long_decode(self, q, kv_cache, block_tables, seq_lens, max_seq_len: int) -> torch.Tensor:
        ws = get_trtllm_workspace(self.cfg.workspace_bytes(), str(self.device))
        return trtllm_batch_decode_with_kv_cache(q, kv_cache, ws, block_tables, seq_lens, max_seq_len)

    def release_request(self, first_page: int, n_pages: int, row: int) -> None:
        self.g_indices[first_page : first_page + n_pages].zero_()  # expect: FC104
        self.eager_indices[first_page : first_page + n_pages] = -1  # ok: FC104
        _pad_rows(self.g_last_page, row, 1)  # expect: FC104

    def defragment(self) -> None:
        torch.cumsum(self.page_counts, 0, out=self.g_indptr[1:])  # expect: FC104

    def stats(self) -> Dict[str, object]:
        w = self.graph_wrappers[self.cfg.max_bucket]
        snap = self.g_indptr.clone()
        snap.clamp_(min=0)  # ok: FC104
        info = {
            "layout": self._kv_layout,  # ok: FC103
            "graph_ws_bytes": self._float_workspace_buffer.numel(),  # ok: FC103
            "graph_mode": w.is_cuda_graph_enabled,  # ok: FC103
            "prefill_plan": self.prefill_wrapper._plan_info,  # expect: FC103
            "jit_module": getattr(self.decode_wrapper, "_cached_module", None) is not None,  # expect: FC103
            "bound_indptr": w._paged_kv_indptr_buf.shape,  # expect: FC103
            "tc_graph": vars(self.tc_wrapper).get("_use_cuda_graph"),  # expect: FC103
            "snapshot": snap,
        }
        for name in _WS_FIELDS:
            info[name] = getattr(self.ragged_wrapper, name).numel()  # expect: FC103
        return info
