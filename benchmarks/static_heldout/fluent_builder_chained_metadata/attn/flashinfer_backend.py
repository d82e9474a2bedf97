"""FlashInfer attention backend: every metadata object comes out of a builder chain."""
import copy
import logging
import os
from typing import Dict, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper as DecodeWrapper
from flashinfer import BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper
from flashinfer import trtllm_batch_decode_with_kv_cache
from flashinfer.decode import fast_decode_plan

from attn.workspaces import scratch_workspace, zeroed_workspace
from fluentmeta import DRAFT_WORKSPACE_BYTES, DecodeMetadata, DecodeMetadataBuilder, EngineConfig
from fluentmeta import ForwardBatch, PrefillMetadata, PrefillMetadataBuilder
from fluentmeta import WindowDecodeBuilder, window_workspace_bytes

logger = logging.getLogger(__name__)


class FlashInferBackend:
    RAGGED_WORKSPACE_BYTES = 64 * 1024 * 1024

    def __init__(self, cfg: EngineConfig, req_to_page: torch.Tensor):
        assert req_to_page.dim() == 2, "req_to_page must be [slots, pages_per_req]"  # expect: FC109
        self.cfg, self.req_to_page, self.device = cfg, req_to_page, req_to_page.device
        dev, trtllm = self.device, cfg.use_trtllm_decode
        self.dims = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)
        layout = "HND" if trtllm else "NHD"
        self._kv_layout = layout  # ok: FC103
        self.workspace = torch.zeros(cfg.planner_workspace_bytes(), dtype=torch.uint8, device=dev)  # ok: FC106
        self.prefill_workspace = torch.empty(cfg.prefill_workspace_bytes, dtype=torch.uint8, device=dev)  # ok: FC106
        self.ragged_workspace = torch.empty(self.RAGGED_WORKSPACE_BYTES, dtype=torch.uint8, device=dev)  # expect: FC106
        self.window_workspace = torch.zeros(window_workspace_bytes(), dtype=torch.uint8, device=dev)  # expect: FC106
        softcap_ws_bytes = int(os.environ.get("FLUENT_SOFTCAP_WS_MB", "64")) << 20
        self.softcap_workspace = torch.zeros(softcap_ws_bytes, dtype=torch.uint8, device=dev)  # expect: FC106
        self.draft_workspace = torch.zeros(DRAFT_WORKSPACE_BYTES, dtype=torch.uint8, device=dev)  # expect: FC106
        self.trtllm_workspace = torch.empty(cfg.planner_workspace_bytes(), dtype=torch.uint8, device=dev)  # expect: FC105
        self.decode_wrapper = DecodeWrapper(self.workspace, layout)
        self.trtllm_wrapper = DecodeWrapper(self.trtllm_workspace, "HND", backend="trtllm-gen")
        self.window_wrapper = DecodeWrapper(self.window_workspace, layout)
        self.softcap_wrapper = DecodeWrapper(self.softcap_workspace, layout)
        self.draft_wrapper = DecodeWrapper(self.draft_workspace, layout)
        draft_ws = zeroed_workspace(cfg.planner_workspace_bytes(), cfg.device)
        self.draft_trtllm = DecodeWrapper(draft_ws, "HND", backend="trtllm-gen")
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, layout)
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.ragged_workspace, layout)
        max_bs = cfg.max_batch_size
        self.eager_kv_indptr, self.eager_kv_indices, self.eager_kv_last_page_len = self._alloc_page_bufs(max_bs)
        eager_w = self.trtllm_wrapper if trtllm else self.decode_wrapper
        eager_bufs = (self.eager_kv_indptr, self.eager_kv_indices, self.eager_kv_last_page_len)
        self.eager_builder = DecodeMetadataBuilder(cfg, req_to_page, eager_w, *eager_bufs)
        window_bufs = self._alloc_page_bufs(max_bs)
        self.window_builder = WindowDecodeBuilder(cfg, req_to_page, self.window_wrapper, *window_bufs).with_window(
            cfg.sliding_window
        )
        self.prefill_builder = PrefillMetadataBuilder(cfg, req_to_page, self.prefill_wrapper, self.ragged_wrapper)
        self.graph_builders: Dict[int, DecodeMetadataBuilder] = {}
        self.decode_meta = self.window_meta = self.draft_positions = None
        self.prefill_meta: Optional[PrefillMetadata] = None
        self.step_scratch: Optional[torch.Tensor] = None

    def _alloc_page_bufs(self, rows: int):
        indptr = torch.zeros(rows + 1, dtype=torch.int32, device=self.device)
        indices = torch.zeros(self.cfg.num_pages, dtype=torch.int32, device=self.device)
        return indptr, indices, torch.ones(rows, dtype=torch.int32, device=self.device)

    def init_cuda_graph_state(self, max_bs: int) -> None:
        self.graph_kv_indptr, self.graph_kv_indices, self.graph_kv_last_page_len = self._alloc_page_bufs(max_bs)
        # padded rows of a bucket read the last page, which the allocator keeps as a dummy
        self.graph_kv_indices.fill_(self.cfg.num_pages - 1)  # ok: FC104

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        if self.step_scratch is None:
            self.step_scratch = torch.empty(self.cfg.max_num_tokens, device=self.device)  # ok: FC107
        self.sample_rows_cpu = torch.empty(batch.batch_size, dtype=torch.int64, pin_memory=True)  # ok: FC107
        if max(batch.seq_lens_cpu.tolist()) > self.cfg.max_context_len:  # ok: FC101
            raise ValueError("request longer than max_context_len")
        if not batch.is_decode:  # ok: FC101
            extend = (batch.extend_seq_lens, batch.extend_seq_lens_cpu, batch.extend_prefix_lens_cpu)
            builder = self.prefill_builder.with_seq_lens(batch.seq_lens, batch.seq_lens_cpu)
            self.prefill_meta = builder.with_requests(batch.req_pool_indices).with_extend(*extend).build()
            self.step_tokens = self.prefill_meta.num_tokens
            return
        n = batch.batch_size
        need = int(batch.seq_lens_cpu.sum()) // self.cfg.page_size + n  # ok: FC101
        if need > self.eager_kv_indices.numel():
            self.eager_kv_indices.resize_(2 * need)  # expect: FC107
        step = copy.copy(self.eager_builder).with_seq_lens(batch.seq_lens, batch.seq_lens_cpu)
        step = step.with_requests(batch.req_pool_indices).with_pages()
        self.decode_meta = (step.with_block_tables() if self.cfg.use_trtllm_decode else step).build()
        eager = self.eager_builder
        self.softcap_wrapper.plan(  # ok: FC102
            eager.kv_indptr_cpu[: n + 1], eager.kv_indices, eager.kv_last_page_len_cpu[:n], *self.dims,
            logits_soft_cap=self.cfg.logits_soft_cap,
        )
        window = copy.copy(self.window_builder).with_seq_lens(batch.seq_lens, batch.seq_lens_cpu)
        self.window_meta = window.with_requests(batch.req_pool_indices).with_pages().build()
        if self.cfg.num_draft_tokens:  # the MTP head attends over the pages the target step just planned
            self.draft_positions = batch.positions.clone()  # expect: FC107
            meta = self.decode_meta
            last_cpu = eager.kv_last_page_len_cpu[:n]
            if self.cfg.use_trtllm_decode:
                self.draft_trtllm.plan(eager.kv_indptr_cpu[: n + 1], meta.kv_indices, last_cpu, *self.dims)  # ok: FC102
            else:
                fast_decode_plan(self.draft_wrapper, meta.kv_indptr, meta.kv_indices, last_cpu, *self.dims)  # expect: FC102

    def init_forward_metadata_capture_cuda_graph(self, bs, seq_lens, seq_lens_cpu, req_pool_indices) -> None:
        trtllm = self.cfg.use_trtllm_decode
        ws = scratch_workspace(self.cfg.planner_workspace_bytes(), self.cfg.device) if trtllm else self.workspace
        w = DecodeWrapper(
            ws, self._kv_layout, use_cuda_graph=True, backend="trtllm-gen" if trtllm else "fa2",  # ok: FC103
            paged_kv_indptr_buffer=self.graph_kv_indptr[: bs + 1], paged_kv_indices_buffer=self.graph_kv_indices,
            paged_kv_last_page_len_buffer=self.graph_kv_last_page_len[:bs],
        )
        graph_bufs = (self.graph_kv_indptr, self.graph_kv_indices, self.graph_kv_last_page_len)
        proto = DecodeMetadataBuilder(self.cfg, self.req_to_page, w, *graph_bufs, graph_mode=True)
        self.graph_builders[bs] = proto
        self.graph_kv_last_page_len[:bs].fill_(1)  # ok: FC104
        if max(seq_lens) > self.cfg.max_context_len:  # expect: FC101
            raise ValueError("capture lengths exceed max_context_len")
        step = copy.copy(proto).with_seq_lens(seq_lens, seq_lens_cpu).with_requests(req_pool_indices).with_pages()
        self.decode_meta = (step.with_block_tables() if trtllm else step).for_bucket(bs).build()
        self.softcap_wrapper.plan(  # expect: FC102
            self.graph_kv_indptr[: bs + 1], self.graph_kv_indices, proto.kv_last_page_len_cpu[:bs], *self.dims,
            logits_soft_cap=self.cfg.logits_soft_cap,
        )

    def _check_bucket(self, bs: int) -> None:
        assert bs in self.graph_builders, f"bucket {bs} was never captured"  # expect: FC109

    def init_forward_metadata_replay_cuda_graph(self, bs, seq_lens, seq_lens_cpu, req_pool_indices) -> None:
        self._check_bucket(bs)
        logger.debug("replay bs=%d lens=%s", bs, seq_lens)  # ok: FC101
        need = int(seq_lens_cpu.sum()) // self.cfg.page_size + bs  # ok: FC101
        if need > self.graph_kv_indices.numel():
            self.graph_kv_indices = torch.empty(2 * need, dtype=torch.int32, device=self.device)  # expect: FC107
        step = copy.copy(self.graph_builders[bs]).with_seq_lens(seq_lens, seq_lens_cpu).with_requests(req_pool_indices)
        step = step.with_pages().for_bucket(bs)
        self.decode_meta = (step.with_block_tables() if self.cfg.use_trtllm_decode else step).build()
        pages = self.decode_meta.num_pages
        logger.info(f"replay bucket {bs}: {pages} pages, lens {seq_lens}")  # expect: FC101
        window = copy.copy(self.window_builder).with_seq_lens(seq_lens)
        self.window_meta = window.with_requests(req_pool_indices).with_pages().build()
        meta = self.decode_meta
        self.softcap_wrapper.plan(  # expect: FC102
            meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len, *self.dims, logits_soft_cap=self.cfg.logits_soft_cap
        )

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, spec) -> torch.Tensor:
        assert isinstance(self.decode_meta, DecodeMetadata), "decode metadata not built"  # ok: FC109
        if not torch.isfinite(q).all():  # expect: FC101
            raise FloatingPointError("non-finite query in decode")
        if spec.sliding_window > 0:
            return self.window_wrapper.run(q, kv_cache)  # expect: FC108
        if spec.logits_soft_cap > 0:
            return self.softcap_wrapper.run(q, kv_cache)  # expect: FC108
        return self.decode_meta.wrapper.run(q, kv_cache)  # ok: FC108

    def forward_draft(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        if self.cfg.use_trtllm_decode:
            return self.draft_trtllm.run(q, kv_cache)  # expect: FC108
        return self.draft_wrapper.run(q, kv_cache)  # expect: FC108

    def forward_extend(self, q, k, v, kv_cache) -> torch.Tensor:
        if self.prefill_meta.use_ragged:
            return self.ragged_wrapper.run(q, k, v)  # ok: FC108
        return self.prefill_wrapper.run(q, kv_cache)  # ok: FC108

    def advance_decode_state(self) -> None:
        # bump the last-page lengths inside the graph so that the next step need not upload them
        self.decode_meta.kv_last_page_len.remainder_(self.cfg.page_size).add_(1)  # expect: FC104

    def release_request(self, positions: torch.Tensor) -> None:
        self.eager_kv_indices.index_fill_(0, positions, 0)  # ok: FC104
        self.graph_kv_indices.index_fill_(0, positions, 0)  # expect: FC104

    def reset_graph_state(self) -> None:
        assert self.graph_builders, "reset before any graph was captured"  # ok: FC109
        for proto in self.graph_builders.values():
            proto.reset()

    def debug_state(self) -> Dict[str, object]:
        int_ws = self.decode_wrapper._int_workspace_buffer  # expect: FC103
        graph = self.decode_wrapper._use_cuda_graph  # expect: FC103
        return {"float_ws": self.workspace.numel(), "int_ws": int_ws.numel(), "graph": graph}

    def warmup(self) -> None:
        if hasattr(self.decode_wrapper, "_cached_module"):  # expect: FC103
            return
        h, kh, d, ps = self.dims
        dummy_indptr = torch.arange(2, dtype=torch.int32, device=self.device)
        ones = torch.ones(1, dtype=torch.int32, device=self.device)
        self.decode_wrapper.plan(dummy_indptr, self.eager_kv_indices[:1], ones, *self.dims)  # expect: FC102
        q = torch.zeros(1, h, d, dtype=torch.bfloat16, device=self.device)
        kv = torch.zeros(1, 2, kh, ps, d, dtype=torch.bfloat16, device=self.device)
        self.decode_wrapper.run(q, kv)  # ok: FC108
        qo_host, last_host = torch.tensor([0, 1], dtype=torch.int32), torch.ones(1, dtype=torch.int32)
        self.ragged_wrapper.plan(qo_host, qo_host, h, kh, d, causal=True)  # ok: FC102
        self.prefill_wrapper.plan(qo_host, qo_host, self.eager_kv_indices[:1], last_host, *self.dims)  # ok: FC102
        if self.cfg.use_trtllm_decode:
            ws = torch.empty(self.cfg.planner_workspace_bytes(), dtype=torch.uint8, device=self.device)  # ok: FC105
            ws.fill_(0)
            trtllm_batch_decode_with_kv_cache(q, kv, ws, self.req_to_page[:1], ones, max_seq_len=1)
