"""FlashInfer paged attention plugin: full attention, graph-mode decode wrappers per bucket."""
from __future__ import annotations

import functools
from typing import Dict

import flashinfer
import torch

from peab.batch import StepBatch
from peab.config import GRAPH_WORKSPACE_BYTES, EngineConfig
from peab.registry import register_backend
from peab_plugins.base import AttentionBackend, KVCache

BACKEND_CLASS = "FlashInferPagedBackend"
_WS_FIELDS = ("_float_workspace_buffer", "_int_workspace_buffer")


def _shared_prefix_workspace_bytes() -> int:
    return 32 * 1024 * 1024


@register_backend("fi_paged")
class FlashInferPagedBackend(AttentionBackend):
    def __init__(self, cfg: EngineConfig, layer_type: str, device: torch.device):
        super().__init__(cfg, layer_type, device)
        self.workspace = torch.empty(cfg.workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.ragged_workspace = torch.empty_like(self.workspace)  # ok: FC105
        self.graph_workspace = torch.empty(GRAPH_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.eager_decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.workspace, self.kv_layout)
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, self.kv_layout)
        self.ragged_wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(self.ragged_workspace, self.kv_layout)
        self._plan_ragged = functools.partial(self.ragged_wrapper.plan, causal=True)
        self.use_ragged = False
        self.use_cascade = cfg.shared_prefix_len > 0
        if self.use_cascade:
            self._num_levels = 2  # ok: FC103
            self.prefix_workspace = torch.zeros(_shared_prefix_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC106
            self.cascade_wrapper = flashinfer.MultiLevelCascadeAttentionWrapper(self._num_levels, self.prefix_workspace, self.kv_layout)
        max_bs = cfg.max_batch_size
        self.eager_kv_indices = torch.empty(cfg.max_num_tokens // cfg.page_size, dtype=torch.int32, device=device)
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_bs * cfg.max_pages_per_seq, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_wrappers: Dict[int, flashinfer.BatchDecodeWithPagedKVCacheWrapper] = {}

    def init_graph_state(self, max_bs: int) -> None:
        assert not self.graph_wrappers, "graph state initialised twice"  # ok: FC109
        self.kv_last_page_len.fill_(1)  # ok: FC104
        for bs in self.cfg.graph_batch_sizes:
            if bs > max_bs:
                break
            self.graph_wrappers[bs] = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace, self.kv_layout, use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1], paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs])

    def init_forward_metadata(self, batch: StepBatch) -> None:
        self.graph_bs = None
        if not batch.is_decode:
            q_lens_cpu = batch.qo_indptr_cpu[1:] - batch.qo_indptr_cpu[:-1]
            self.use_ragged = torch.equal(q_lens_cpu, batch.seq_lens_cpu)  # ok: FC101
            if self.use_ragged:
                self._plan_ragged(batch.qo_indptr_cpu, batch.qo_indptr_cpu, *self.dims[:3])  # ok: FC102
            else:
                self.prefill_wrapper.plan(  # expect: FC102
                    batch.qo_indptr, batch.kv_indptr_cpu, batch.kv_indices, batch.kv_last_page_len_cpu,
                    *self.dims, causal=True, sm_scale=self._sm_scale)
            return
        if self.use_cascade:
            self._plan_cascade(batch)
        num_pages = batch.num_kv_pages
        if num_pages > self.eager_kv_indices.numel():
            self.eager_kv_indices.resize_(num_pages)  # expect: FC107
        self.eager_kv_indices[:num_pages].copy_(batch.kv_indices)  # ok: FC104
        self.eager_decode.plan(  # expect: FC102
            batch.kv_indptr, self.eager_kv_indices[:num_pages], batch.kv_last_page_len_cpu, *self.dims,
            sm_scale=self._sm_scale)
        # the KV-append kernel reads the last-page lengths from the device copy
        self.kv_last_page_len[: batch.batch_size].copy_(batch.kv_last_page_len, non_blocking=True)  # expect: FC104

    def _plan_cascade(self, batch: StepBatch) -> None:
        # level 0: the system prompt every request shares; level 1: each request's own pages
        bs, shared, ps = batch.batch_size, batch.shared_prefix_pages, self.cfg.page_size
        unique_qo = torch.arange(bs + 1, dtype=torch.int32, device=self.device)
        self.cascade_wrapper.plan(  # expect: FC102
            [torch.tensor([0, bs], dtype=torch.int32), unique_qo],
            [torch.tensor([0, shared], dtype=torch.int32), batch.kv_indptr_cpu],
            [batch.kv_indices[:shared], batch.kv_indices[shared:]],
            [torch.tensor([ps], dtype=torch.int32), batch.kv_last_page_len_cpu], *self.dims)

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        self.graph_bs = bs
        self.kv_indptr_host[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.kv_last_page_len_host[:bs] = 1
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1], self.kv_indices[:bs], self.kv_last_page_len_host[:bs], *self.dims,
            sm_scale=self._sm_scale)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: StepBatch) -> None:
        assert bs in self.graph_wrappers, f"no decode graph for batch size {bs}"  # expect: FC109
        self.graph_bs = bs
        real = batch.batch_size
        num_pages = int(batch.kv_indptr_cpu[-1])  # ok: FC101
        self.kv_indptr_host[: real + 1] = batch.kv_indptr_cpu
        self.kv_indptr_host[real + 1 : bs + 1] = num_pages
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_host[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:num_pages].copy_(batch.kv_indices, non_blocking=True)  # ok: FC104
        self.kv_last_page_len[:real].copy_(batch.kv_last_page_len, non_blocking=True)  # ok: FC104
        self.graph_wrappers[bs].plan(  # expect: FC102
            self.kv_indptr[: bs + 1], self.kv_indices, self.kv_last_page_len[:bs], *self.dims,
            sm_scale=self._sm_scale)
        self.kv_last_page_len[real:bs].fill_(1)  # expect: FC104

    def forward_decode(self, q: torch.Tensor, kv_cache: KVCache, layer_id: int) -> torch.Tensor:
        if self.use_cascade:
            return self.cascade_wrapper.run(q, kv_cache)  # expect: FC108
        w = self.graph_wrappers[self.graph_bs] if self.graph_bs is not None else self.eager_decode
        return w.run(q, kv_cache)  # ok: FC108

    def forward_extend(self, q, k, v, kv_cache: KVCache, layer_id: int) -> torch.Tensor:
        if self.use_ragged:
            return self.ragged_wrapper.run(q, k, v)
        return self.prefill_wrapper.run(q, kv_cache)  # ok: FC108

    def graph_plan_stats(self) -> Dict[str, object]:
        stats: Dict[str, object] = {f"bs{bs}": w._plan_info for bs, w in self.graph_wrappers.items()}  # expect: FC103
        for w in (self.eager_decode, self.prefill_wrapper, self.ragged_wrapper):
            stats[type(w).__name__] = [getattr(w, f).numel() for f in _WS_FIELDS]  # expect: FC103
        return stats
