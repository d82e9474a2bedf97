import logging
import math
import weakref
from typing import Dict, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper, MultiLevelCascadeAttentionWrapper
from flashinfer import trtllm_batch_context_with_kv_cache, trtllm_batch_decode_with_kv_cache

from fincore.limits import PAGE_SIZE, ServeLimits
from fincore.state import DecodeBatch, RequestState
from finattn.buffers import PadOnExit, StageOnExit, pad_from
from finattn.workspace import cascade_workspace, prefill_workspace, ragged_workspace, trtllm_workspace, verify_workspace

logger = logging.getLogger(__name__)


def _reset_plan(self) -> None:
    self._plan_info = None  # expect: FC103


BatchDecodeWithPagedKVCacheWrapper.reset_plan = _reset_plan


@torch.jit.script
def clamp_last_page(last: torch.Tensor, page: int) -> torch.Tensor:
    assert page > 0  # ok: FC109
    return last.clamp(1, page)


class FlashInferAttn:
    def __init__(self, limits: ServeLimits, device: torch.device):
        self.limits = limits
        self.device = device
        self.dims = (limits.num_heads, limits.num_kv_heads, limits.head_dim)
        self._kv_layout = "NHD"
        self._plan_info: Dict[int, int] = {}
        self.graph_bs: Optional[int] = None
        self.decode_backend = "trtllm-gen" if limits.max_seqs <= 64 else "fa2"
        self.decode_ws = torch.empty(limits.split_kv_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.window_ws = torch.zeros(limits.window_ws_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.lse_workspace = torch.zeros(limits.max_tokens * limits.num_heads, dtype=torch.float32, device=device)  # ok: FC106
        self.ctx_ws = torch.empty(limits.split_kv_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.ctx_ws.fill_(0)
        self.mtp_ws = torch.zeros(limits.split_kv_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(prefill_workspace(device), "NHD")
        self.ragged = BatchPrefillWithRaggedKVCacheWrapper(ragged_workspace(device), "NHD")
        self.verify = BatchPrefillWithPagedKVCacheWrapper(verify_workspace(device), "NHD")
        self.decode = BatchDecodeWithPagedKVCacheWrapper(self.decode_ws, "NHD", backend=self.decode_backend)
        self.window = BatchDecodeWithPagedKVCacheWrapper(self.window_ws, "NHD")
        self.cascade = MultiLevelCascadeAttentionWrapper(2, cascade_workspace(device), "NHD")
        self.qo_indptr_buf = torch.zeros(limits.max_seqs + 1, dtype=torch.int32, device=device)
        self.tmp_lens: Optional[torch.Tensor] = None
        self.eager_indices = torch.full((limits.max_pages,), -1, dtype=torch.int32, device=device)
        self.shared_pages = torch.zeros(0, dtype=torch.int32, device=device)
        self.prev_indptr_cpu = torch.zeros(limits.max_seqs + 1, dtype=torch.int32)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.init_graph_buffers()
        self.g_last.fill_(1)  # ok: FC104
        setattr(self.window, "_use_cuda_graph", False)  # expect: FC103

    def init_graph_buffers(self) -> None:
        max_bs = max(self.limits.buckets)
        assert max_bs <= self.limits.max_seqs, "bucket above the batch limit"  # ok: FC109
        self.g_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.g_indices = torch.zeros(self.limits.max_pages, dtype=torch.int32, device=self.device)
        self.g_last = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.indptr_pinned = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_pinned = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_bufs = {"indptr": self.g_indptr, "indices": self.g_indices, "last": self.g_last}
        self.graph_ws = torch.empty(self.limits.split_kv_bytes(), dtype=torch.uint8, device=self.device)  # ok: FC105
        self._float_workspace_buffer = self.graph_ws
        for bs in self.limits.buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=self.g_indptr[: bs + 1],
                paged_kv_indices_buffer=self.g_indices, paged_kv_last_page_len_buffer=self.g_last[:bs],
            )
        self.g_indices.zero_()  # ok: FC104

    def init_forward_metadata(self, batch: DecodeBatch) -> None:
        assert batch.num_seqs <= self.limits.max_seqs, "batch above the limit"  # expect: FC109
        n = batch.num_seqs
        h = self.dims[0]
        if n + 1 > self.qo_indptr_buf.numel():
            self.qo_indptr_buf = torch.empty(n + 1, dtype=torch.int32, device=self.device)  # expect: FC107
        if self.tmp_lens is None:
            self.tmp_lens = torch.empty(self.limits.max_seqs, dtype=torch.int32, device=self.device)  # ok: FC107
        batch.scratch = torch.zeros(n, h, dtype=torch.float32, device=self.device)  # ok: FC107
        long_rows = bool((batch.seq_lens > self.limits.window).any())  # expect: FC101
        avg_pages = math.ceil(batch.seq_lens.float().mean() / PAGE_SIZE)  # expect: FC101
        n_tok = int(batch.input_ids.numel())  # ok: FC101
        logger.debug("metadata: %d rows, %d tokens, ~%d pages, lens %s", n, n_tok, avg_pages, batch.seq_lens)  # ok: FC101
        if batch.is_decode:  # ok: FC101
            self._plan_decode(batch, long_rows)
        else:
            self._plan_prefill(batch)

    def _plan_prefill(self, batch: DecodeBatch) -> None:
        h, kv, d = self.dims
        total = int(batch.qo_indptr[-1])  # expect: FC101
        kv_lens = batch.seq_lens.cpu()  # expect: FC101
        total_cpu = int(batch.qo_indptr_cpu[-1])  # ok: FC101
        if total != total_cpu:
            raise RuntimeError(f"query length mismatch: {batch.qo_indptr} vs {kv_lens}")  # ok: FC101
        q_lens = batch.qo_indptr[1:] - batch.qo_indptr[:-1]
        rows = torch.arange(batch.num_seqs, device=self.device)
        tok_rows = torch.repeat_interleave(rows, q_lens, output_size=total_cpu)  # ok: FC101
        logger.debug("prefill rows per token: %s", tok_rows)
        if total_cpu <= self.limits.max_tokens // 4:
            self.ragged.plan(  # expect: FC102
                qo_indptr=batch.qo_indptr, kv_indptr=batch.qo_indptr, num_qo_heads=h, num_kv_heads=kv, head_dim_qk=d, causal=True
            )
        else:
            self.ragged.plan(batch.qo_indptr_cpu, batch.qo_indptr_cpu, h, kv, d, causal=True)  # ok: FC102
        self.prefill.plan(  # ok: FC102
            batch.qo_indptr_cpu, batch.kv_indptr_cpu, batch.kv_indices, batch.last_page_len_cpu, h, kv, d, PAGE_SIZE, causal=True
        )
        self.verify.plan(batch.qo_indptr, batch.kv_indptr_cpu, batch.kv_indices, batch.last_page_len_cpu, h, kv, d, PAGE_SIZE)  # expect: FC102

    def _plan_decode(self, batch: DecodeBatch, long_rows: bool) -> None:
        h, kv, d = self.dims
        n = batch.num_seqs
        lens = batch.seq_lens_cpu.tolist()  # ok: FC101
        if torch.equal(self.prev_indptr_cpu[: n + 1], batch.kv_indptr_cpu) and not long_rows:  # ok: FC101
            return
        self.prev_indptr_cpu[: n + 1] = batch.kv_indptr_cpu
        if long_rows:
            self.decode.plan(batch.kv_indptr_cpu, batch.kv_indices, batch.last_page_len.to(self.device), h, kv, d, PAGE_SIZE)  # expect: FC102
        else:
            self.decode.plan(batch.kv_indptr_cpu, batch.kv_indices, batch.last_page_len_cpu, h, kv, d, PAGE_SIZE)  # ok: FC102
        plan_window = self.window.plan
        plan_window(batch.window_indptr_gpu, batch.kv_indices, batch.last_page_len_cpu, h, kv, d, PAGE_SIZE)  # expect: FC102
        shared_qo = torch.tensor([0, n], dtype=torch.int32)
        shared_indptr = torch.tensor([0, self.shared_pages.numel()], dtype=torch.int32)
        shared_last = torch.tensor([PAGE_SIZE], dtype=torch.int32)
        self.cascade.plan(  # expect: FC102
            [shared_qo, batch.qo_indptr], [shared_indptr, batch.kv_indptr_cpu], [self.shared_pages, batch.kv_indices],
            [shared_last, batch.last_page_len_cpu], h, kv, d, PAGE_SIZE,
        )
        logger.debug("decode plan for lengths %s", lens)

    def plan_window_host(self, batch: DecodeBatch, window_indptr_cpu: torch.Tensor) -> None:
        h, kv, d = self.dims
        self.window.plan(window_indptr_cpu, batch.kv_indices, batch.last_page_len_cpu, h, kv, d, PAGE_SIZE)  # ok: FC102
        self.cascade.plan(  # ok: FC102
            [torch.tensor([0, batch.num_seqs], dtype=torch.int32), batch.qo_indptr_cpu],
            [torch.tensor([0, self.shared_pages.numel()], dtype=torch.int32), batch.kv_indptr_cpu],
            [self.shared_pages, batch.kv_indices], [torch.tensor([PAGE_SIZE], dtype=torch.int32), batch.last_page_len_cpu],
            h, kv, d, PAGE_SIZE,
        )

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        h, kv, d = self.dims
        w = self.graph_wrappers[bs]
        w.plan(self.indptr_pinned[: bs + 1], self.g_indices, self.last_pinned[:bs], h, kv, d, PAGE_SIZE)  # ok: FC102
        self.graph_bs = bs
        logger.info("bucket %d planned: %s", bs, w._plan_info)  # expect: FC103

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: DecodeBatch) -> None:
        h, kv, d = self.dims
        n = batch.num_seqs
        rows = batch.seq_lens.tolist()  # expect: FC101
        long_rows = [i for i in range(n) if batch.seq_lens[i] > self.limits.window]  # expect: FC101
        self.g_seq_lens = batch.seq_lens.clone()  # expect: FC107
        with StageOnExit(self.g_indptr, self.indptr_pinned, n + 1) as staged:
            staged.copy_(batch.kv_indptr_cpu)
        self.indptr_pinned[n + 1 : bs + 1] = batch.kv_indptr_cpu[-1]
        self.g_indptr[n + 1 : bs + 1].copy_(self.indptr_pinned[n + 1 : bs + 1], non_blocking=True)  # ok: FC104
        self.g_indices[: batch.kv_indices.numel()].copy_(batch.kv_indices, non_blocking=True)  # ok: FC104
        w = self.graph_wrappers[bs]
        args = (self.g_indptr[: bs + 1], self.g_indices, self.g_last[:bs], h, kv, d, PAGE_SIZE)
        with PadOnExit(self.g_last, n, bs) as live:
            live.copy_(batch.last_page_len, non_blocking=True)  # ok: FC104
            w.plan(*args)  # expect: FC102
        torch.clamp(self.g_last[:bs], min=1, max=PAGE_SIZE, out=self.g_last[:bs])  # expect: FC104
        self.last_pinned[:bs] = 1  # ok: FC104
        self._plan_info[bs] = len(rows) - len(long_rows)  # ok: FC103
        self.graph_bs = bs

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, window: bool, shared: bool, verify: bool):
        if verify:
            return self.verify.run(q, kv_cache)  # expect: FC108
        if window:
            return self.window.run(q, kv_cache)  # expect: FC108
        if shared:
            return self.cascade.run(q, kv_cache)  # expect: FC108
        if self.graph_bs is None:
            return self.decode.run(q, kv_cache)  # expect: FC108
        w = self.decode if self.graph_bs == 0 else self.graph_wrappers[self.graph_bs]
        return w.run(q, kv_cache)  # ok: FC108

    def forward_graph(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        return self.graph_wrappers[bs].run(q, kv_cache)  # ok: FC108

    def forward_extend(self, q, k, v, kv_cache, block_tables, seq_lens, sm_scale: float, ragged: bool):
        if seq_lens.shape[0] == 1 and q.shape[0] > self.limits.window:
            return trtllm_batch_context_with_kv_cache(q, kv_cache, self.ctx_ws, block_tables, seq_lens, sm_scale)
        if ragged:
            return self.ragged.run(q, k, v)  # ok: FC108
        return self.prefill.run(q, kv_cache)  # ok: FC108

    def forward_long_decode(self, q, kv_cache, block_tables, seq_lens, max_len: int, draft: bool):
        ws = self.mtp_ws if draft else trtllm_workspace(self.limits, self.device)
        return trtllm_batch_decode_with_kv_cache(q, kv_cache, ws, block_tables, seq_lens, max_len)

    def track(self, state: RequestState) -> weakref.finalize:
        return weakref.finalize(state, self._on_request_dead, state.pages[0], len(state.pages), state.row)

    def _on_request_dead(self, first: int, n_pages: int, row: int) -> None:
        self.g_indices[first : first + n_pages].zero_()  # expect: FC104
        self.eager_indices[first : first + n_pages] = -1  # ok: FC104
        if row >= 0:
            pad_from(self.g_last, row)  # expect: FC104

    def stats(self) -> Dict[str, object]:
        w = self.graph_wrappers[max(self.limits.buckets)]
        return {
            "layout": self._kv_layout,  # ok: FC103
            "graph_ws": self._float_workspace_buffer.numel(),  # ok: FC103
            "graph_mode": w.is_cuda_graph_enabled,  # ok: FC103
            "decode_jit": hasattr(self.decode, "_cached_module"),  # expect: FC103
            "int_ws": self.prefill._int_workspace_buffer.numel(),  # expect: FC103
            "decode_indices": self.decode.__dict__.get("_paged_kv_indices_buf"),  # expect: FC103
        }
