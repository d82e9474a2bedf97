"""FlashInfer attention backend: plans from pinned records, graph wrappers per batch size."""

from __future__ import annotations

import logging
from dataclasses import fields
from typing import Dict, Optional

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
    trtllm_batch_context_with_kv_cache,
    trtllm_batch_decode_with_kv_cache,
)

from prm_engine.config import WORKSPACE_BYTES, EngineConfig
from prm_engine.records import (
    AttnScratch,
    DecodeMeta,
    DecodePlanArgs,
    ForwardBatch,
    PagedIndexRecord,
    PlanRecord,
    PrefillPlanArgs,
)
from prm_tree.move import move, pin_tree, stage_tree
from prm_tree.workspaces import (
    cascade_workspace,
    float_workspace,
    trtllm_context_workspace,
    trtllm_decode_workspace,
)

logger = logging.getLogger(__name__)

# Buffers a graph-mode wrapper keeps; checked once per captured size.
_BOUND_BUFS = ("_paged_kv_indptr_buf", "_paged_kv_indices_buf", "_paged_kv_last_page_len_buf")


class FlashInferAttnBackend:
    def __init__(self, cfg: EngineConfig, model_runner):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.kv_pool = model_runner.kv_pool
        self.req_to_page = model_runner.req_to_page
        self._kv_layout = "NHD"
        max_bs = cfg.max_bs

        self.workspace = float_workspace("decode", self.device)
        self.prefill_ws = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106  # ok: FC105
        self.scratch = AttnScratch.allocate(cfg.trtllm_workspace_bytes, self.device)

        # graph-bound decode metadata (persistent) and their pinned host mirrors
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.kv_indices = torch.zeros(cfg.max_num_pages, dtype=torch.int32, device=self.device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.workspace, self._kv_layout)  # ok: FC103
        self.window_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.scratch.float_ws, self._kv_layout)
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, self._kv_layout)
        self.cascade_wrapper = MultiLevelCascadeAttentionWrapper(2, cascade_workspace(self.device), self._kv_layout)
        self.trtllm_decode: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
        if cfg.use_trtllm_decode:
            idx = self.device.index or 0
            self.trtllm_decode = BatchDecodeWithPagedKVCacheWrapper(
                trtllm_decode_workspace(idx, cfg.trtllm_workspace_bytes), "HND", backend="trtllm-gen"
            )
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.graph_args: Dict[int, DecodePlanArgs] = {}
        self.plan_cache: Dict[int, PlanRecord] = {}
        self.forward_metadata: Optional[DecodeMeta] = None

    def init_cuda_graph_state(self, max_bs: int) -> None:
        self.kv_last_page_len.fill_(1)  # ok: FC104
        self.kv_indptr.zero_()

    # ------------------------------------------------------------------ host-side page records
    def _page_record(self, seq_lens_cpu: torch.Tensor) -> PagedIndexRecord:
        page = self.cfg.page_size
        bs = seq_lens_cpu.shape[0]
        pages = (seq_lens_cpu + page - 1) // page
        indptr = torch.zeros(bs + 1, dtype=torch.int32)
        torch.cumsum(pages, 0, out=indptr[1:])
        last = ((seq_lens_cpu - 1) % page + 1).to(torch.int32)
        return PagedIndexRecord(kv_indptr=indptr, kv_last_page_len=last, num_pages=int(indptr[-1]))  # ok: FC101

    def _gather_pages(self, req_pool_indices: torch.Tensor, host: PagedIndexRecord, out: torch.Tensor) -> torch.Tensor:
        # rows of the request-to-page table, concatenated; a Triton kernel in production
        counts = host.kv_indptr[1:] - host.kv_indptr[:-1]
        rows = self.req_to_page[req_pool_indices]
        cols = torch.arange(rows.shape[1], device=rows.device).unsqueeze(0)
        keep = cols < counts.to(rows.device, non_blocking=True).unsqueeze(1)
        flat = torch.where(keep, rows, torch.zeros_like(rows))  # ok: FC101
        out[: host.num_pages].copy_(flat.flatten()[: host.num_pages])
        return out[: host.num_pages]

    # ------------------------------------------------------------------ per-step metadata
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        if fb.forward_mode.is_decode():
            self._init_decode(fb)
        else:
            self._init_extend(fb)

    def _decode_args(self, host: PagedIndexRecord, kv_indices: torch.Tensor) -> DecodePlanArgs:
        c = self.cfg
        return DecodePlanArgs(
            host.kv_indptr, kv_indices, host.kv_last_page_len, c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size
        )

    def _init_decode(self, fb: ForwardBatch) -> None:
        host = self._page_record(fb.seq_lens_cpu).pin()
        kv_indices = self._gather_pages(fb.req_pool_indices, host, torch.empty_like(self.kv_indices))
        args = self._decode_args(host, kv_indices)
        self.decode_wrapper.plan(**args._asdict())  # ok: FC102, FC103
        if self.trtllm_decode is not None:
            self.trtllm_decode.plan(*args)  # ok: FC102
        dev = host.to(self.device, non_blocking=True)
        meta = DecodeMeta(self.decode_wrapper, dev.kv_indptr, dev.kv_last_page_len, fb.seq_lens, 0, False)
        self.forward_metadata = meta._replace(max_len=int(fb.seq_lens.max()))  # expect: FC101
        if self.cfg.window_left >= 0:
            # the window kernels read the indptr on the device, so plan with the moved copy
            win = move(args, self.device, non_blocking=True)
            self.window_wrapper.plan(**win._asdict(), window_left=self.cfg.window_left)  # expect: FC102  # ok: FC103

    def _init_extend(self, fb: ForwardBatch) -> None:
        c = self.cfg
        bs = fb.batch_size
        host = self._page_record(fb.seq_lens_cpu).pin()
        max_q = int(fb.extend_seq_lens_cpu.max())  # ok: FC101
        qo_indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32, pin_memory=True)
        torch.cumsum(fb.extend_seq_lens_cpu, 0, out=qo_indptr_cpu[1:])
        kv_indices = self._gather_pages(fb.req_pool_indices, host, torch.empty_like(self.kv_indices))
        plan_tree = {"qo_indptr": qo_indptr_cpu, "kv_indptr": host.kv_indptr, "last": host.kv_last_page_len}
        dev_tree = stage_tree(plan_tree, self.device)
        plan = PrefillPlanArgs(
            qo_indptr=dev_tree["qo_indptr"],
            paged_kv_indptr=host.kv_indptr,
            paged_kv_indices=kv_indices,
            paged_kv_last_page_len=host.kv_last_page_len,
            num_qo_heads=c.num_qo_heads,
            num_kv_heads=c.num_kv_heads,
            head_dim_qk=c.head_dim,
            page_size=c.page_size,
        )
        self.prefill_wrapper.plan(**{f.name: getattr(plan, f.name) for f in fields(plan)})  # expect: FC102
        self.extend_max_q = max_q
        self.extend_tree = dev_tree
        if c.enable_cascade:
            shared = self._page_record(fb.seq_lens_cpu[:1])
            levels = pin_tree(
                {
                    "qo": [torch.tensor([0, int(qo_indptr_cpu[-1])], dtype=torch.int32), qo_indptr_cpu],
                    "kv": [shared.kv_indptr, host.kv_indptr],
                    "last": [shared.kv_last_page_len, host.kv_last_page_len],
                }
            )
            self.cascade_wrapper.plan(  # ok: FC102
                levels["qo"], levels["kv"], [kv_indices[: shared.num_pages], kv_indices], levels["last"],
                c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size,
            )

    # ------------------------------------------------------------------ CUDA graphs
    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        c = self.cfg
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.workspace,
            self._kv_layout,
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
        )
        for name in _BOUND_BUFS:
            if getattr(w, name, None) is None:  # expect: FC103
                raise RuntimeError(f"graph wrapper for bs={bs} did not keep {name}")
        self.graph_wrappers[bs] = w
        dummy = self._page_record(torch.ones(bs, dtype=torch.int32))
        args = self._decode_args(dummy, self.kv_indices)
        self.graph_args[bs] = args
        w.plan(dummy.kv_indptr, self.kv_indices, dummy.kv_last_page_len, *args[3:])  # ok: FC102
        self.forward_metadata = DecodeMeta(
            w, self.kv_indptr[: bs + 1], self.kv_last_page_len[:bs], fb.seq_lens, 1, c.enable_cascade
        )

    def init_forward_metadata_replay_cuda_graph(
        self, bs: int, seq_lens_cpu: torch.Tensor, req_pool_indices: torch.Tensor
    ) -> None:
        host = self._page_record(seq_lens_cpu[:bs])
        if host.num_pages > self.kv_indices.numel():
            self.kv_indices.resize_(host.num_pages)  # expect: FC107
        self.kv_indptr_cpu[: bs + 1].copy_(host.kv_indptr)
        self.kv_last_page_len_cpu[:bs].copy_(host.kv_last_page_len)
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        self._gather_pages(req_pool_indices, host, self.kv_indices)
        w = self.graph_wrappers[bs]
        # the bound last-page buffer already holds this step's values after the copy below
        self.kv_last_page_len[:bs].copy_(self.kv_last_page_len_cpu[:bs], non_blocking=True)
        args = self.graph_args[bs]._replace(indptr=self.kv_indptr_cpu[: bs + 1], last_page_len=self.kv_last_page_len[:bs])
        w.plan(**args._asdict())  # expect: FC102  # ok: FC103
        self.kv_indptr_cpu[bs + 1 :].zero_()  # ok: FC104
        rec = PlanRecord(bs, host.num_pages)
        rec.fi_plan_info = w._plan_info  # expect: FC103
        self.plan_cache[bs] = rec

    # ------------------------------------------------------------------ forward
    def forward_decode(self, q, k, v, layer, fb: ForwardBatch):
        meta = self.forward_metadata
        cache = self.kv_pool.kv_buffer(layer.layer_id)
        self.kv_pool.store(layer.layer_id, fb.out_cache_loc, k, v)
        if layer.sliding_window > 0:
            return self.window_wrapper.run(q, cache)  # expect: FC108
        if meta.use_cascade:
            return self.cascade_wrapper.run(q, cache)  # expect: FC108
        if layer.use_trtllm_direct:
            return trtllm_batch_decode_with_kv_cache(
                q, cache, self.scratch.trtllm_ws, self.req_to_page[fb.req_pool_indices], meta.seq_lens, meta.max_len,
                bmm1_scale=layer.scaling, bmm2_scale=1.0,
            )
        if self.trtllm_decode is not None:
            return self.trtllm_decode.run(q, cache)  # expect: FC108
        if not fb.use_graph:
            return self.decode_wrapper.run(q, cache)  # ok: FC108
        # padded rows carry a zero length; keep the kernel's last page at least one slot long
        meta.kv_last_page_len.clamp_(min=1)  # expect: FC104
        if not vars(meta.wrapper).get("_use_cuda_graph", False):  # expect: FC103
            logger.warning("decode wrapper for bs=%d is not in graph mode", fb.batch_size)
        return meta.wrapper.run(q, cache)  # ok: FC108

    def forward_extend(self, q, k, v, layer, fb: ForwardBatch):
        cache = self.kv_pool.kv_buffer(layer.layer_id)
        self.kv_pool.store(layer.layer_id, fb.out_cache_loc, k, v)
        if self.cfg.use_trtllm_decode and layer.layer_id == 0 and fb.batch_size == 1:
            idx = self.device.index or 0
            ws = trtllm_context_workspace(idx, self.cfg.trtllm_workspace_bytes)
            return trtllm_batch_context_with_kv_cache(
                query=q, kv_cache=cache, workspace_buffer=ws, block_tables=self.req_to_page[fb.req_pool_indices],
                seq_lens=fb.seq_lens, max_q_len=self.extend_max_q, max_kv_len=self.cfg.max_context_len,
                bmm1_scale=layer.scaling, bmm2_scale=1.0, batch_size=fb.batch_size,
                cum_seq_lens_q=self.extend_tree["qo_indptr"], cum_seq_lens_kv=self.extend_tree["kv_indptr"],
            )
        return self.prefill_wrapper.run(q, cache)  # ok: FC108
