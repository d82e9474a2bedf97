"""Everything attention needs at one TP degree: workspaces, wrappers, graph buffers."""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, CUDAGraphBatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from elastictp.kv import ShardedKVCache
from elastictp.limits import EngineLimits
from elastictp.topology import ModelDims, TPLayout


class TPAttnState:
    # graph workspace of the TP=2 bring-up; TP=4 halves the heads, so "it fits"
    GRAPH_WS_BYTES = 96 << 20

    def __init__(
        self,
        dims: ModelDims,
        limits: EngineLimits,
        layout: TPLayout,
        kv: ShardedKVCache,
        device: torch.device,
        shared_trt_ws: Optional[torch.Tensor] = None,
        use_graphs: bool = True,
    ) -> None:
        self.dims = dims
        self.limits = limits
        self.layout = layout
        self.kv = kv
        self.device = device
        self._use_cuda_graph = use_graphs
        self.workspace = torch.zeros(limits.decode_ws_bytes(layout.q_heads, dims.head_dim), dtype=torch.uint8, device=device)  # ok: FC106
        self.graph_workspace = torch.zeros(self.GRAPH_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        if shared_trt_ws is not None:
            self.trt_ws = shared_trt_ws
        else:
            self.trt_ws = torch.empty(limits.trtllm_ws_bytes(layout.q_heads, dims.head_dim), dtype=torch.uint8, device=device)  # expect: FC105
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD", use_tensor_cores=True)
        # replicated KV head: all local query heads share one KV head
        self.replica_decode = BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD", use_tensor_cores=True)

        max_bs = max(limits.graph_buckets)
        max_idx = max_bs * limits.max_pages_per_req
        self.graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.graph_kv_indices = torch.zeros(max_idx, dtype=torch.int32, device=device)
        self.graph_last_page_len = torch.empty(max_bs, dtype=torch.int32, device=device)
        self.graph_last_page_len.fill_(1)  # ok: FC104
        self.kv_last_page_len = torch.ones(limits.max_batch, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices_cpu = torch.zeros(max_idx, dtype=torch.int32, pin_memory=True)
        self.last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.out_loc = torch.zeros(limits.max_batch, dtype=torch.int64, device=device)
        self.head_perm = torch.arange(layout.kv_heads, device=device) + layout.rank * layout.kv_heads
        self.graph_wrappers: Dict[int, CUDAGraphBatchDecodeWithPagedKVCacheWrapper] = {}
        self.graph_bs: Optional[int] = None

    def _heads(self, replica: bool = False) -> dict:
        return dict(
            num_qo_heads=self.layout.q_heads,
            num_kv_heads=1 if replica else self.layout.kv_heads,
            head_dim=self.dims.head_dim,
            page_size=self.limits.page_size,
            q_data_type=self.limits.dtype,
        )

    def init_graph_wrappers(self) -> None:
        if not self._use_cuda_graph:  # ok: FC103
            return
        for bs in self.limits.graph_buckets:
            self.graph_wrappers[bs] = CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                self.graph_kv_indptr[: bs + 1],
                self.graph_kv_indices,
                self.graph_last_page_len[:bs],
                "NHD",
                use_tensor_cores=True,
            )

    def active_wrapper(self):
        return self.graph_wrappers[self.graph_bs] if self.graph_bs is not None else self.decode_wrapper

    def plan_decode(self, indptr_np: np.ndarray, indices_np: np.ndarray, last_np: np.ndarray) -> None:
        self.graph_bs = None
        n = len(indptr_np) - 1
        self.kv_last_page_len[:n].copy_(torch.from_numpy(last_np), non_blocking=True)
        self.decode_wrapper.plan(  # expect: FC102
            torch.from_numpy(indptr_np),
            torch.from_numpy(indices_np).to(self.device, non_blocking=True),
            self.kv_last_page_len[:n],
            **self._heads(),
        )
        if self.layout.kv_replicated:
            self.plan_replica(indptr_np, indices_np, last_np)

    def plan_replica(self, indptr_np: np.ndarray, indices_np: np.ndarray, last_np: np.ndarray) -> None:
        self.replica_decode.plan(
            torch.from_numpy(indptr_np),
            torch.from_numpy(indices_np).to(self.device, non_blocking=True),
            torch.from_numpy(last_np),
            **self._heads(replica=True),
        )

    def decode_long(
        self, q: torch.Tensor, layer_id: int, block_tables: torch.Tensor, seq_lens: torch.Tensor, max_len: int
    ) -> torch.Tensor:
        return trtllm_batch_decode_with_kv_cache(
            q,
            self.kv.pages[layer_id],
            self.trt_ws,
            block_tables,
            seq_lens,
            max_len,
            bmm1_scale=self.dims.head_dim ** -0.5,
            bmm2_scale=1.0,
        )
