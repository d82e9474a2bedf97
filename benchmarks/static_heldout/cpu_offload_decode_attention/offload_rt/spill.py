"""Spilling: when a request's recent window outgrows ``window_pages``, its oldest window pages move to the host."""

from __future__ import annotations

from offattn.batch import OffloadBatch
from offattn.config import OffloadConfig
from offattn.gpu_pool import GPUPagePool
from offattn.host_pages import HostPageStore
from offload_rt.gpu_attention import RecentWindowAttention


class PageSpiller:
    def __init__(self, cfg: OffloadConfig, pool: GPUPagePool, store: HostPageStore, attn: RecentWindowAttention):
        self.cfg = cfg
        self.pool = pool
        self.store = store
        self.attn = attn

    def spill_overflow(self, batch: OffloadBatch) -> None:
        for row, rid in enumerate(batch.rids):
            over = self.pool.window_len(rid) - self.cfg.window_pages
            if over > 0:
                self._spill_row(rid, row, over)

    def _spill_row(self, rid: int, row: int, k: int) -> None:
        s = self.cfg.sink_pages
        victim = self.pool.page_table_dev[row, s : s + k].cpu()  # expect: FC101
        host_ids = self.store.take(k)
        for layer in range(self.cfg.num_layers):
            for hp, gp in zip(host_ids, victim.tolist()):
                self.store.k[layer][hp].copy_(self.pool.k[layer][gp], non_blocking=True)
                self.store.v[layer][hp].copy_(self.pool.v[layer][gp], non_blocking=True)
        self.store.append(rid, host_ids)
        self.pool.release_window_prefix(rid, row, k)
        # shift the staged graph's page list for this row instead of re-planning the bucket
        start = int(self.attn.window_indptr_pinned[row])
        end = int(self.attn.window_indptr_pinned[row + 1])
        bound = self.attn.graph_kv_indices
        bound[start : end - k].copy_(bound[start + k : end].clone())  # expect: FC104
