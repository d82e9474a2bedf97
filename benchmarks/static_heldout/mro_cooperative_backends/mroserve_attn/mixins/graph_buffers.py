"""CUDA-graph decode state shared by every graph-capable backend."""

from __future__ import annotations

from typing import Dict, List, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from mroserve.batch import ForwardBatch


class GraphBuffersMixin:
    """Graph-bound index buffers and one graph-mode decode wrapper per bucket.

    The captured kernels read ``graph_kv_indptr``, ``graph_kv_indices`` and
    ``graph_kv_last_page_len`` by address; ``plan()`` before each replay fills
    them from the pinned ``*_cpu`` mirrors. While ``_graph_bs`` is set (capture
    and replay), decode runs through the bucket's wrappers; eager steps fall
    through to the next class in the MRO.
    """

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.supports_cuda_graph = True

    def __init__(self, cfg, device, **kwargs) -> None:
        super().__init__(cfg, device, **kwargs)
        max_bs = max(cfg.graph_batch_sizes)
        self.graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.graph_kv_indices = torch.zeros(max_bs * cfg.max_pages_per_seq, dtype=torch.int32, device=self.device)
        self.graph_kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.graph_kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.graph_kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_workspace = torch.empty(cfg.graph_workspace_bytes, dtype=torch.uint8, device=self.device)  # expect: FC105
        self.graph_decode_wrappers: Dict[int, Dict[int, BatchDecodeWithPagedKVCacheWrapper]] = {}
        self._graph_bs: Optional[int] = None
        self._use_cuda_graph = cfg.enable_cuda_graph  # ok: FC103

    def init_cuda_graph_state(self, max_bs: int) -> None:
        if not self._use_cuda_graph:
            return
        self.graph_kv_last_page_len.fill_(1)  # ok: FC104
        for bs in self.cfg.graph_batch_sizes:
            if bs > max_bs:
                break
            self.graph_decode_wrappers[bs] = {
                wl: BatchDecodeWithPagedKVCacheWrapper(
                    self.graph_workspace,
                    "NHD",
                    use_cuda_graph=True,
                    paged_kv_indptr_buffer=self.graph_kv_indptr[: bs + 1],
                    paged_kv_indices_buffer=self.graph_kv_indices,
                    paged_kv_last_page_len_buffer=self.graph_kv_last_page_len[:bs],
                    backend=self.decode_backend,
                )
                for wl in self.cfg.window_lefts()
            }

    def graph_wrappers(self, bs: int) -> List[BatchDecodeWithPagedKVCacheWrapper]:
        return list(self.graph_decode_wrappers[bs].values())

    def _graph_wrapper(self, layer) -> BatchDecodeWithPagedKVCacheWrapper:
        assert self._graph_bs is not None, "graph wrapper requested outside capture/replay"  # ok: FC109
        return self.graph_decode_wrappers[self._graph_bs][layer.window_left]

    def _fill_host_mirrors(self, bs: int, fb: ForwardBatch) -> None:
        """Copy the real rows' host metadata and pad the bucket with empty requests."""
        n = fb.batch_size
        self.graph_kv_indptr_cpu[: n + 1].copy_(fb.kv_indptr_cpu[: n + 1])
        self.graph_kv_indptr_cpu[n + 1 : bs + 1] = fb.kv_indptr_cpu[n]
        self.graph_kv_last_page_len_cpu[:n].copy_(fb.kv_last_page_len_cpu[:n])
        self.graph_kv_last_page_len_cpu[n:bs] = 1

    def _plan_graph(self, bs: int, n_pages: int) -> None:
        cfg = self.cfg
        for wl, wrapper in self.graph_decode_wrappers[bs].items():
            wrapper.plan(  # ok: FC102
                self.graph_kv_indptr_cpu[: bs + 1],
                self.graph_kv_indices[:n_pages],
                self.graph_kv_last_page_len_cpu[:bs],
                cfg.num_qo_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                cfg.page_size,
                window_left=wl,
                q_data_type=cfg.dtype,
            )

    # ------------------------------------------------------------------ per step

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        self._graph_bs = None
        super().init_forward_metadata(fb)

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        self._graph_bs = bs
        self._fill_host_mirrors(bs, fb)
        n_pages = bs
        self.graph_kv_indices[:n_pages].copy_(fb.kv_indices[:n_pages])
        self._plan_graph(bs, n_pages)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        self._graph_bs = bs
        if bs + 1 > self.graph_kv_indptr_cpu.numel():
            self.graph_kv_indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32, pin_memory=True)  # ok: FC107
        self._fill_host_mirrors(bs, fb)
        n_pages = int(self.graph_kv_indptr_cpu[bs])  # ok: FC101
        if n_pages > self.graph_kv_indices.numel():
            self.graph_kv_indices = torch.zeros(2 * n_pages, dtype=torch.int32, device=self.device)  # expect: FC107
        self.graph_kv_indices[:n_pages].copy_(fb.kv_indices[:n_pages], non_blocking=True)  # ok: FC104
        self._plan_graph(bs, n_pages)

    def forward_decode(self, q, k, v, layer, fb: ForwardBatch) -> torch.Tensor:
        if self._graph_bs is None:
            return super().forward_decode(q, k, v, layer, fb)
        return self._graph_wrapper(layer).run(q, self.kv_caches[layer.layer_id])  # ok: FC108
