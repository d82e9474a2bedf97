"""FlashInfer attention for the async engine: eager wrappers per step, graph-mode decode wrappers per size."""

import functools

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    trtllm_batch_decode_with_kv_cache,
)

from asyncserve.config import PREFILL_WS_MB, AsyncEngineConfig
from asyncserve.protocol import DevicePlan


class AsyncFlashInferBackend:
    def __init__(self, cfg: AsyncEngineConfig, device):
        self.cfg = cfg
        self.device = device
        self.decode_workspace = torch.empty(cfg.decode_ws_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.prefill_workspace = torch.zeros(PREFILL_WS_MB << 20, dtype=torch.uint8, device=device)  # expect: FC106
        self.chunk_workspace = torch.zeros(cfg.chunk_ws_bytes(), dtype=torch.uint8, device=device)
        self.trtllm_workspace = torch.zeros(cfg.trtllm_ws_bytes(), dtype=torch.uint8, device=device)  # ok: FC105

        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, "NHD")
        self.chunk_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.chunk_workspace, "NHD")
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD")
        self._plan_prefill = functools.partial(
            self.prefill_wrapper.plan,
            num_qo_heads=cfg.num_qo_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim_qk=cfg.head_dim,
            page_size=cfg.page_size,
            causal=True,
        )
        self.graph_wrappers = {}
        self.active_bs = None

        max_bs = cfg.max_batch_size
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(cfg.max_total_pages, dtype=torch.int32, device=device)
        self.kv_last_page_buf = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.eager_indices = torch.zeros(cfg.initial_eager_pages, dtype=torch.int32, device=device)
        self.eager_indices_pinned = torch.zeros(cfg.initial_eager_pages, dtype=torch.int32, pin_memory=True)

    def init_graph_state(self):
        self.kv_last_page_buf.fill_(1)  # ok: FC104
        self.kv_indptr_buf.zero_()

    def _heads(self):
        c = self.cfg
        return c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size

    def _plan_chunk(self, plan: DevicePlan):
        self.chunk_wrapper.plan(
            plan.chunk_indptr_cpu,
            plan.chunk_indices_dev,
            plan.chunk_last_page_cpu,
            *self._heads(),
        )

    def init_forward_metadata(self, plan: DevicePlan):
        self.active_bs = None
        if not plan.is_decode:
            self._plan_prefill(  # expect: FC102
                plan.qo_indptr_dev,
                plan.kv_indptr_cpu,
                plan.kv_indices_dev,
                plan.last_page_cpu,
            )
            return
        n = plan.kv_indices_dev.shape[0]
        if n > self.eager_indices.shape[0]:
            grow = n - self.eager_indices.shape[0]
            self.eager_indices = torch.cat([self.eager_indices, self.eager_indices.new_zeros(grow)])  # expect: FC107
            self.eager_indices_pinned = torch.zeros(self.eager_indices.shape[0], dtype=torch.int32, pin_memory=True)  # ok: FC107
        self.eager_indices_pinned[:n].copy_(plan.kv_indices_cpu)
        self.eager_indices[:n].copy_(self.eager_indices_pinned[:n], non_blocking=True)
        self.decode_wrapper.plan(  # expect: FC102
            plan.kv_indptr_dev,
            self.eager_indices[:n],
            plan.last_page_cpu,
            *self._heads(),
        )
        self._plan_chunk(plan)

    def init_forward_metadata_capture_cuda_graph(self, bs: int, plan: DevicePlan):
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.decode_workspace,
            "NHD",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices_buf,
            paged_kv_last_page_len_buffer=self.kv_last_page_buf[:bs],
        )
        self.graph_wrappers[bs] = w
        self.active_bs = bs
        w.plan(plan.kv_indptr_cpu, self.kv_indices_buf, plan.last_page_cpu, *self._heads())
        self._plan_chunk(plan)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, plan: DevicePlan):
        self.active_bs = bs
        n = plan.kv_indices_dev.shape[0]
        self.kv_indices_buf[:n].copy_(plan.kv_indices_dev, non_blocking=True)  # ok: FC104
        self._plan_chunk(plan)
        self.graph_wrappers[bs].plan(  # ok: FC102
            plan.kv_indptr_cpu,
            self.kv_indices_buf,
            plan.last_page_cpu,
            *self._heads(),
        )

    def forward_decode(self, q, cache, layer, plan: DevicePlan):
        if plan.use_trtllm:
            return trtllm_batch_decode_with_kv_cache(
                q,
                cache,
                self.trtllm_workspace,
                plan.block_tables_dev,
                plan.seq_lens_dev,
                plan.max_seq_len,
                bmm1_scale=layer._sm_scale,  # ok: FC103
                bmm2_scale=1.0,
            )
        if self.active_bs in self.graph_wrappers:
            w = self.graph_wrappers[self.active_bs]
        else:
            w = self.decode_wrapper
        return w.run(q, cache)  # ok: FC108

    def forward_extend(self, q, cache):
        return self.prefill_wrapper.run(q, cache)
