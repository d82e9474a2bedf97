"""The H2O decode loop: attend, accumulate page mass, evict and compact between steps, rebuild page tables."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from h2o.attn.backend import H2OAttention
from h2o.kv.page_pool import CompressedPagePool
from h2o.model import H2OModel, PagedKV
from h2o.policy import PAGE_SIZE, EvictionBudget, HeavyHitterTracker

logger = logging.getLogger(__name__)


@dataclass
class Request:
    rid: int
    row: int
    seq_len: int
    last_token: int
    max_new_tokens: int
    generated: int = 0


class H2OGraphCache:
    def __init__(self, model: H2OModel, attn: H2OAttention, buckets, max_pages: int, device: torch.device):
        self.model = model
        self.attn = attn
        self.buckets = tuple(buckets)
        max_bs = max(self.buckets)
        self.static_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_slots = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_page_rows = torch.zeros((max_bs, max_pages), dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.mempool = None

    def record(self, bs: int) -> None:
        self.attn.prepare_decode(bs, bs)
        ids, slots, page_rows = self.static_ids[:bs], self.static_slots[:bs], self.static_page_rows[:bs]
        self.model.decode(ids, slots, page_rows, bs, bs)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            out = self.model.decode(ids, slots, page_rows, bs, bs)
        if self.mempool is None:
            self.mempool = graph.pool()
        self.graphs[bs] = graph
        self.outputs[bs] = out

    def record_all(self) -> None:
        self.attn.build_graph_wrappers(self.buckets)
        for bs in sorted(self.buckets, reverse=True):
            self.record(bs)

    def run(self, bs: int, bucket: int, ids: torch.Tensor, slots: torch.Tensor, page_rows: torch.Tensor) -> torch.Tensor:
        self.static_ids[:bs].copy_(ids)
        self.static_slots[:bs].copy_(slots)
        self.static_page_rows[:bs, : page_rows.shape[1]].copy_(page_rows)
        self.graphs[bucket].replay()
        return self.outputs[bucket][:bs]

    def capture_stats(self) -> Dict[int, float]:
        """Largest logit of every bucket's last output, for the debug endpoint."""
        return {bs: self.outputs[bs].abs().max().item() for bs in self.graphs}  # ok: FC101


class H2OEngine:
    def __init__(
        self,
        budget: EvictionBudget,
        vocab: int = 32000,
        hidden: int = 4096,
        layers: int = 32,
        heads: int = 32,
        kv_heads: int = 8,
        head_dim: int = 128,
        max_batch: int = 128,
        num_pages: int = 65536,
        buckets=(1, 2, 4, 8, 16, 32, 64, 128),
        device: Optional[torch.device] = None,
    ):
        assert budget.heavy_ratio + budget.recent_ratio <= 1.0  # expect: FC109
        device = device or torch.device("cuda")
        self.budget = budget
        self.device = device
        self.max_pages = budget.max_pages + 1
        self.pool = CompressedPagePool(num_pages, max_batch, self.max_pages, device)
        self.attn = H2OAttention(heads, kv_heads, head_dim, max_batch, budget, self.pool, device)
        self.kv = PagedKV(layers, num_pages, kv_heads, head_dim, device)
        self.model = H2OModel(vocab, hidden, layers, heads, kv_heads, head_dim, self.attn, self.kv).to(device)
        self.tracker = HeavyHitterTracker(max_batch, self.max_pages, budget.decay, device)
        self.graphs = H2OGraphCache(self.model, self.attn, buckets, self.max_pages, device)
        self.recent_pages = budget.recent_pages()
        self.running: List[Request] = []

    def _bucket(self, bs: int) -> int:
        for b in self.graphs.buckets:
            if b >= bs:
                return b
        return 0

    def decode_step(self) -> Tuple[List[int], Optional[torch.Tensor]]:
        batch = self.running
        bs = len(batch)
        if bs == 0:
            return [], None
        bucket = self._bucket(bs)
        lens_np = np.array([r.seq_len + 1 for r in batch], dtype=np.int64)
        full_rows = np.flatnonzero((lens_np - 1) % PAGE_SIZE == 0)
        self.pool.append_page(full_rows)

        # evict down to the budget; how many pages each row gives back is known on the host
        used_np = self.pool.used_pages_host[:bs].numpy()  # ok: FC101
        n_evict = int(used_np.max()) - self.budget.max_pages
        if n_evict > 0:
            victims = self.tracker.select_victims(bs, n_evict, int(used_np.max()), self.recent_pages)
            self.pool.evict(bs, victims)
            self.tracker.forget(bs, victims)
            self.pool.compact(bs, self.attn.page_indices)  # expect: FC104
        over = self.pool.used_pages[:bs] > self.budget.max_pages
        n_over = int(over.sum())  # expect: FC101
        if n_over:
            logger.warning("%d requests still over the KV budget after eviction", n_over)
        total, _ = self.pool.flatten(bs, lens_np)

        self.attn.prepare_decode(bs, bucket)
        ids = torch.tensor([r.last_token for r in batch], dtype=torch.int64).to(self.device, non_blocking=True)
        last_cols = torch.from_numpy(self.pool.used_pages_host[:bs].numpy() - 1).to(self.device, non_blocking=True)
        last_pages = self.pool.page_table[torch.arange(bs, device=self.device), last_cols.long()]
        slots = last_pages.long() * PAGE_SIZE + torch.from_numpy((lens_np - 1) % PAGE_SIZE).to(self.device, non_blocking=True)
        page_rows = self.pool.page_table[:bs].clamp(min=0).long()
        if bucket:
            logits = self.graphs.run(bs, bucket, ids, slots, page_rows)
        else:
            logits = self.model.decode(ids, slots, page_rows, bs, 0)
        self.tracker.accumulate(bs, self.attn.page_scores[:bs], int(used_np.max()))
        next_tokens = logits.argmax(dim=-1)
        for r in batch:
            r.seq_len += 1
            r.generated += 1
        return [r.rid for r in batch], next_tokens
