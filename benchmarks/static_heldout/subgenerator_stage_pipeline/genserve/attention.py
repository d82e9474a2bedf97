"""FlashInfer wrappers, their workspaces and the graph-bound paged-KV tables."""

from __future__ import annotations

from typing import Dict, List

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
)

from .batch import StepMeta
from .buffers import DeviceBuffer, HostBuffer, StepBuffers, materialize
from .config import CASCADE_WORKSPACE_BYTES, EngineConfig


class KVCache:
    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        self._kv_layout = "HND"
        self.layers: List[torch.Tensor] = [
            torch.zeros(
                cfg.num_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim, dtype=cfg.dtype, device=device
            )
            for _ in range(cfg.num_layers)
        ]

    def layer(self, layer_id: int) -> torch.Tensor:
        return self.layers[layer_id]

    def zero_pages(self, pages: torch.Tensor) -> None:
        index = pages.long()
        for cache in self.layers:
            cache.index_fill_(0, index, 0)


class AttentionBackend:
    # graph-bound tables: every bucket's CUDA-graph wrapper views a prefix of these
    kv_indptr = DeviceBuffer(lambda s: (s.cfg.max_batch_size + 1,))
    kv_indices = DeviceBuffer(lambda s: (s.cfg.max_batch_size * s.cfg.max_pages_per_seq,))
    kv_last_page_len = DeviceBuffer(lambda s: (s.cfg.max_batch_size,), fill=1)
    # pinned host mirrors handed to plan()
    kv_indptr_host = HostBuffer(lambda s: (s.cfg.max_batch_size + 1,))
    kv_last_page_len_host = HostBuffer(lambda s: (s.cfg.max_batch_size,), fill=1)

    def __init__(self, cfg: EngineConfig, bufs: StepBuffers) -> None:
        self.cfg = cfg
        self.bufs = bufs
        self.device = torch.device(cfg.device)
        self.kv_cache = KVCache(cfg, self.device)
        self.layout = self.kv_cache._kv_layout  # ok: FC103

        self.float_workspace = torch.empty(cfg.float_workspace_bytes(), dtype=torch.uint8, device=self.device)  # ok: FC105
        self.cascade_workspace = torch.empty(CASCADE_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.trtllm_workspace = torch.empty(cfg.trtllm_workspace_bytes(), dtype=torch.uint8, device=self.device)  # expect: FC105
        self.graph_workspace = torch.zeros(cfg.graph_workspace_bytes(), dtype=torch.uint8, device=self.device)  # ok: FC106
        prefill_ws = torch.empty(cfg.trtllm_workspace_bytes(), dtype=torch.uint8, device=self.device)  # ok: FC105
        prefill_ws.zero_()

        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.float_workspace, self.layout, use_tensor_cores=True)
        self.window_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.float_workspace, self.layout, use_tensor_cores=True)
        self.long_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.trtllm_workspace, self.layout, backend="trtllm-gen"
        )
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.float_workspace, self.layout)
        self.long_prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(prefill_ws, self.layout, backend="trtllm-gen")
        self.cascade_wrapper = MultiLevelCascadeAttentionWrapper(2, self.cascade_workspace, self.layout)
        self.graph_wrappers: Dict[int, CUDAGraphBatchDecodeWithPagedKVCacheWrapper] = {}

    # ----------------------------------------------------------------------------------------- set-up
    def init_graph_buffers(self) -> None:
        materialize(self)
        self.kv_indptr.zero_()  # ok: FC104
        self.kv_last_page_len.fill_(1)
        self.kv_indices.zero_()

    def init_graph_wrappers(self) -> None:
        for bs in self.cfg.decode_buckets:
            self.graph_wrappers[bs] = CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                self.kv_indptr[: bs + 1],
                self.kv_indices,
                self.kv_last_page_len[:bs],
                kv_layout=self.layout,
                use_tensor_cores=True,
            )

    def dtype_kwargs(self) -> dict:
        cfg = self.cfg
        return dict(q_data_type=cfg.dtype, kv_data_type=cfg.dtype)

    def prepare_dummy_batch(self, bs: int) -> StepMeta:
        """One page per dummy sequence; planned before each bucket is captured."""
        cfg = self.cfg
        indptr_host = torch.arange(bs + 1, dtype=torch.int32)
        last_host = torch.ones(bs, dtype=torch.int32)
        self.kv_indices[:bs].copy_(torch.arange(bs, dtype=torch.int32), non_blocking=True)  # ok: FC104
        self.graph_wrappers[bs].plan(  # ok: FC102
            indptr_host,
            self.kv_indices[:bs],
            last_host,
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            **self.dtype_kwargs(),
        )
        self.window_wrapper.plan(
            indptr_host,
            self.kv_indices[:bs],
            last_host,
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            window_left=cfg.sliding_window - 1,
            **self.dtype_kwargs(),
        )
        return StepMeta(
            batch_size=bs,
            bucket=bs,
            is_prefill=False,
            input_ids=self.bufs.input_ids[:bs],
            positions=self.bufs.positions[:bs],
            seq_lens=self.bufs.seq_lens[:bs],
            qo_indptr=torch.arange(bs + 1, dtype=torch.int32, device=self.device),
            qo_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32),
            kv_indptr_cpu=indptr_host,
            kv_indices=self.kv_indices[:bs],
            kv_last_page_len_cpu=last_host,
            max_len=1,
        )

    # ----------------------------------------------------------------------------------------- forward
    def attend_decode(self, q: torch.Tensor, layer_id: int, meta: StepMeta) -> torch.Tensor:
        kv = self.kv_cache.layer(layer_id)
        if self.cfg.is_window_layer(layer_id):
            return self.window_wrapper.run(q, kv)  # expect: FC108
        if meta.bucket is not None:
            wrapper = self.graph_wrappers[meta.bucket]
        elif meta.max_len >= self.cfg.long_context_len:
            wrapper = self.long_decode_wrapper
        else:
            wrapper = self.decode_wrapper
        return wrapper.run(q, kv)  # ok: FC108

    def attend_prefill(self, q: torch.Tensor, layer_id: int, meta: StepMeta) -> torch.Tensor:
        kv = self.kv_cache.layer(layer_id)
        if meta.shared_prefix is not None:
            return self.cascade_wrapper.run(q, kv)
        if meta.max_len >= self.cfg.long_context_len:
            return self.long_prefill_wrapper.run(q, kv)
        return self.prefill_wrapper.run(q, kv)  # ok: FC108

    # ----------------------------------------------------------------------------------------- debugging
    def debug_dump(self) -> Dict[str, List[int]]:
        indptr = self.kv_indptr.cpu().tolist()  # ok: FC101
        return {"kv_indptr": indptr, "kv_last_page_len": self.kv_last_page_len_host.tolist()}
