"""Attention of one pipeline stage: eager FlashInfer wrappers and graph-mode decode wrappers per slot."""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Iterable

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper, merge_state
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from ppengine.config import PAGE_SIZE, PipelineConfig, overflow_workspace, prefill_workspace, stage_workspace
from ppengine.config import trtllm_decode_workspace, window_workspace

if TYPE_CHECKING:
    from ppengine.microbatch import SlotBuffers
    from stages.stage import StageMeta


class StageAttention:
    """Shared by the decoder layers of one stage: planned once per micro-batch, run by every layer."""
    def __init__(self, cfg: PipelineConfig, stage_id: int):
        assert 0 <= stage_id < cfg.num_stages, "stage id out of range"  # expect: FC109
        self.cfg, self.stage_id = cfg, stage_id
        self._kv_layout = "NHD"  # ok: FC103
        self._backend = "trtllm-gen" if cfg.decode_backend == "trtllm-gen" else "fa2"  # ok: FC103
        self.dims, dev, layout = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim), cfg.device, self._kv_layout
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(prefill_workspace(dev), layout)
        ragged_ws = torch.empty(cfg.planner_workspace_bytes(), dtype=torch.uint8, device=dev)  # ok: FC105
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(ragged_ws, layout)
        self.window_wrapper = BatchDecodeWithPagedKVCacheWrapper(window_workspace(dev), layout)
        self.prefix_wrapper = BatchPrefillWithPagedKVCacheWrapper(stage_workspace(stage_id, dev), layout)
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(trtllm_decode_workspace(cfg, zero=True), layout, backend=self._backend)
        self.prefix_pages = torch.zeros(0, dtype=torch.int32, device=dev)
        self.graph_workspaces: Dict[int, torch.Tensor] = {}
        self.graph_decode: Dict[int, Dict[int, BatchDecodeWithPagedKVCacheWrapper]] = {}

    def init_graph_wrappers(self, slot: int, bufs: "SlotBuffers", buckets: Iterable[int]) -> None:
        self.graph_workspaces[slot] = torch.empty(self.cfg.planner_workspace_bytes(), dtype=torch.uint8, device=self.cfg.device)  # expect: FC105
        bufs.kv_last_page_len.fill_(1)  # ok: FC104
        per_bs = self.graph_decode.setdefault(slot, {})
        for bs in buckets:
            per_bs[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspaces[slot], self._kv_layout, use_cuda_graph=True, backend=self._backend,
                paged_kv_indptr_buffer=bufs.kv_indptr[: bs + 1], paged_kv_indices_buffer=bufs.kv_indices,
                paged_kv_last_page_len_buffer=bufs.kv_last_page_len[:bs],
            )

    def ensure_graph_workspace(self, slot: int, nbytes: int) -> None:
        if nbytes > self.graph_workspaces[slot].numel():
            self.graph_workspaces[slot] = torch.zeros(nbytes, dtype=torch.uint8, device=self.cfg.device)  # expect: FC107

    def plan_extend(self, meta: "StageMeta") -> None:
        """Prefill: ragged attention when nothing is cached yet, paged attention over the cache otherwise."""
        hq, hk, d = self.dims
        if meta.no_prefix:
            self.ragged_wrapper.plan(meta.qo_indptr_cpu, meta.qo_indptr_cpu, hq, hk, d, causal=True)  # ok: FC102
            return
        self.prefill_wrapper.plan(**dict(  # expect: FC102
            qo_indptr=meta.qo_indptr, paged_kv_indptr=meta.kv_indptr_cpu, paged_kv_indices=meta.kv_indices,
            paged_kv_last_page_len=meta.kv_last_page_len_cpu, num_qo_heads=hq, num_kv_heads=hk, head_dim_qk=d,
            page_size=PAGE_SIZE, causal=True))

    def plan_shared_prefix(self, meta: "StageMeta") -> None:
        """Every request shares the system-prompt pages: one extra level merged in front of the decode."""
        n, p = meta.num_reqs, self.cfg.shared_prefix_pages
        if p > self.prefix_pages.numel():
            extra = torch.arange(self.prefix_pages.numel(), p, dtype=torch.int32, device=self.cfg.device)
            self.prefix_pages = torch.cat([self.prefix_pages, extra])  # expect: FC107
        kv_indptr = torch.arange(0, (n + 1) * p, p, dtype=torch.int32, device=self.cfg.device)
        qo_cpu, last_cpu = meta.qo_indptr_cpu[: n + 1], meta.kv_last_page_len_cpu.new_full((n,), PAGE_SIZE)
        self.prefix_wrapper.plan(qo_cpu, kv_indptr, self.prefix_pages.repeat(n), last_cpu, *self.dims, PAGE_SIZE)  # expect: FC102

    def decode(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: "StageMeta", windowed: bool) -> torch.Tensor:
        if meta.block_tables is not None:
            # Overflow micro-batch on trtllm-gen: no plan, the kernel walks the block tables itself.
            ws = overflow_workspace(self.cfg)
            return trtllm_batch_decode_with_kv_cache(q, kv_cache, ws, meta.block_tables, meta.seq_lens, meta.max_seq_len)
        if windowed and int(meta.seq_lens.max()) > self.cfg.window_size:  # expect: FC101
            return self.window_wrapper.run(q, kv_cache)  # expect: FC108
        w = self.graph_decode[meta.slot][meta.bucket] if meta.graph else self.decode_wrapper
        o, lse = w.run_return_lse(q, kv_cache)  # ok: FC108
        if not self.cfg.shared_prefix_pages:
            return o
        p_o, p_lse = self.prefix_wrapper.run_return_lse(q, kv_cache)  # expect: FC108
        return merge_state(p_o, p_lse, o, lse)[0]

    def extend(self, q, k, v, kv_cache: torch.Tensor, meta: "StageMeta") -> torch.Tensor:
        if meta.no_prefix:
            return self.ragged_wrapper.run(q, k, v)  # ok: FC108
        return self.prefill_wrapper.run(q, kv_cache)  # ok: FC108
