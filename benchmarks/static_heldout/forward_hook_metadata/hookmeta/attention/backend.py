"""FlashInfer attention for hookmeta.

The backend owns the wrappers and their buffers; it never decides *when* to plan.  The forward
pre-hooks in :mod:`hookmeta.attention.hooks` call ``plan_*`` once per step before the decoder runs,
and the graph runner calls the ``init_forward_metadata_*_cuda_graph`` pair.  ``forward`` then only
runs whichever wrapper the last plan selected.
"""

import math
from typing import Dict, List, Optional

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
)
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from hookmeta.config import PREFILL_WORKSPACE_BYTES, EngineConfig
from hookmeta.forward_batch import ForwardBatch


class PagedKVPool:
    """One HND page table per layer: [num_pages, 2, num_kv_heads, page_size, head_dim]."""

    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.page_size = cfg.page_size
        shape = (cfg.max_num_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim)
        self.kv: List[torch.Tensor] = [
            torch.zeros(shape, dtype=cfg.dtype, device=device) for _ in range(cfg.num_layers)
        ]

    def layer(self, layer_id: int) -> torch.Tensor:
        return self.kv[layer_id]

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        page = loc // self.page_size
        offset = loc % self.page_size
        cache = self.kv[layer_id]
        cache[page, 0, :, offset] = k
        cache[page, 1, :, offset] = v

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.kv)


class HookedFlashInferBackend:
    GRAPH_WORKSPACE_BYTES = 128 * 1024 * 1024

    def __init__(self, cfg: EngineConfig, kv_pool: PagedKVPool):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.kv_pool = kv_pool
        self.kv_layout = "HND"
        self.sm_scale = 1.0 / math.sqrt(cfg.head_dim)
        self.window_left = -1
        ws_bytes = cfg.workspace_bytes()

        self.workspace = torch.zeros(ws_bytes, dtype=torch.uint8, device=self.device)  # ok: FC106
        self.prefill_workspace = torch.empty(PREFILL_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.window_workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=self.device)  # ok: FC105
        self.raw_workspace = torch.zeros(ws_bytes, dtype=torch.uint8, device=self.device)  # ok: FC105

        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, self.kv_layout, use_tensor_cores=True
        )
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self.kv_layout)
        self.window_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.window_workspace, self.kv_layout, use_tensor_cores=True, backend="fa2"
        )
        if cfg.decode_kernel == "trtllm-gen":
            self.trtllm_workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=self.device)  # expect: FC105
            self.trtllm_wrapper = BatchDecodeWithPagedKVCacheWrapper(
                self.trtllm_workspace, self.kv_layout, backend="trtllm-gen"
            )
        else:
            self.trtllm_wrapper = None

        # set by the last plan; `forward` runs it
        self.active_wrapper = None
        self.graph_wrappers: Dict[int, CUDAGraphBatchDecodeWithPagedKVCacheWrapper] = {}
        self.graph_workspace: Optional[torch.Tensor] = None

    # ------------------------------------------------------------------ eager plans (pre-hooks)

    def _decode_plan_kwargs(self) -> dict:
        return dict(q_data_type=self.cfg.dtype, kv_data_type=self.cfg.dtype, sm_scale=self.sm_scale)

    def plan_decode(self, batch: ForwardBatch) -> None:
        c = self.cfg
        self.decode_wrapper.plan(  # ok: FC102
            batch.kv_indptr_cpu,
            batch.kv_indices,
            batch.kv_last_page_len_cpu,
            c.num_qo_heads,
            c.num_kv_heads,
            c.head_dim,
            c.page_size,
            **self._decode_plan_kwargs(),
        )
        self.active_wrapper = self.decode_wrapper

    def plan_trtllm_decode(self, batch: ForwardBatch) -> None:
        c = self.cfg
        self.trtllm_wrapper.plan(  # expect: FC102
            batch.kv_indptr_cpu,
            batch.kv_indices,
            batch.kv_last_page_len,
            c.num_qo_heads,
            c.num_kv_heads,
            c.head_dim,
            c.page_size,
            **self._decode_plan_kwargs(),
        )
        self.active_wrapper = self.trtllm_wrapper

    def plan_window(self, batch: ForwardBatch) -> None:
        c = self.cfg
        self.window_wrapper.plan(  # ok: FC102
            batch.kv_indptr_cpu,
            batch.kv_indices,
            batch.kv_last_page_len_cpu,
            c.num_qo_heads,
            c.num_kv_heads,
            c.head_dim,
            c.page_size,
            window_left=self.window_left,
            **self._decode_plan_kwargs(),
        )

    def plan_extend(self, batch: ForwardBatch) -> None:
        c = self.cfg
        self.prefill_wrapper.plan(  # expect: FC102
            batch.qo_indptr,
            batch.kv_indptr_cpu,
            batch.kv_indices,
            batch.kv_last_page_len_cpu,
            c.num_qo_heads,
            c.num_kv_heads,
            c.head_dim,
            c.page_size,
            causal=True,
            sm_scale=self.sm_scale,
            q_data_type=c.dtype,
        )
        self.active_wrapper = self.prefill_wrapper

    # ------------------------------------------------------------------ CUDA graphs

    def init_cuda_graph_state(self, max_bs: int) -> None:
        max_pages = self.cfg.max_num_pages
        self.graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.graph_kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=self.device)
        self.graph_kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_workspace = torch.zeros(self.GRAPH_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106
        for bs in self.cfg.decode_buckets:
            if bs > max_bs:
                break
            self.graph_wrappers[bs] = CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                self.graph_kv_indptr[: bs + 1],
                self.graph_kv_indices,
                self.graph_kv_last_page_len[:bs],
                self.kv_layout,
                use_tensor_cores=True,
            )

    def init_forward_metadata_capture_cuda_graph(self, bs: int, num_pages: int) -> None:
        c = self.cfg
        wrapper = self.graph_wrappers[bs]
        per_req = num_pages // bs
        self.kv_indptr_host[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32) * per_req
        self.kv_last_page_len_host[:bs] = 1
        self.graph_kv_indices[:num_pages].copy_(torch.arange(num_pages, dtype=torch.int32, device=self.device))  # ok: FC104
        wrapper.plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1],
            self.graph_kv_indices[:num_pages],
            self.kv_last_page_len_host[:bs],
            c.num_qo_heads,
            c.num_kv_heads,
            c.head_dim,
            c.page_size,
            **self._decode_plan_kwargs(),
        )
        self.active_wrapper = wrapper

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: ForwardBatch) -> None:
        c = self.cfg
        n = batch.batch_size
        wrapper = self.graph_wrappers[bs]
        if batch.num_pages > self.graph_kv_indices.numel():
            self.graph_kv_indices = torch.empty(batch.num_pages, dtype=torch.int32, device=self.device)  # expect: FC107
        self.kv_indptr_host[: n + 1].copy_(batch.kv_indptr_cpu)
        self.kv_indptr_host[n + 1 : bs + 1] = batch.num_pages
        self.kv_last_page_len_host[:n].copy_(batch.kv_last_page_len_cpu)
        self.kv_last_page_len_host[n:bs] = 1
        self.graph_kv_indices[: batch.num_pages].copy_(batch.kv_indices, non_blocking=True)  # ok: FC104
        wrapper.plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1],
            self.graph_kv_indices[: batch.num_pages],
            self.kv_last_page_len_host[:bs],
            c.num_qo_heads,
            c.num_kv_heads,
            c.head_dim,
            c.page_size,
            **self._decode_plan_kwargs(),
        )
        # padded rows must not read past their single dummy page
        self.graph_kv_last_page_len[n:bs].fill_(1)  # expect: FC104
        self.active_wrapper = wrapper

    # ------------------------------------------------------------------ forward

    def forward(self, q, k, v, layer_id: int, batch: ForwardBatch) -> torch.Tensor:
        self.kv_pool.set_kv(layer_id, batch.out_cache_loc, k, v)
        kv_cache = self.kv_pool.layer(layer_id)
        if batch.raw_decode:
            return trtllm_batch_decode_with_kv_cache(
                q,
                kv_cache,
                self.raw_workspace,
                batch.block_tables,
                batch.seq_lens,
                self.cfg.max_context_len,
                bmm1_scale=self.sm_scale,
                bmm2_scale=1.0,
            )
        wrapper = self.active_wrapper
        if wrapper is None:
            raise RuntimeError("attention was not planned for this step: is MetadataHooks installed?")
        return wrapper.run(q, kv_cache)  # ok: FC108

    def forward_window(self, q, k, v, layer_id: int, batch: ForwardBatch) -> torch.Tensor:
        self.kv_pool.set_kv(layer_id, batch.out_cache_loc, k, v)
        kv_cache = self.kv_pool.layer(layer_id)
        return self.window_wrapper.run(q, kv_cache)  # expect: FC108
