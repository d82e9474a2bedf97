"""An engine whose KV cache is checked in the background and healed around bad pages."""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np
import torch

from kg_attn.backend import ScannerBackend
from kg_attn.meta import build_step_meta
from kvguard import ChecksumRecords, IntegrityConfig, IntegrityScanner, PageTable, QuarantineSet

from .graphs import DecodeGraphs
from .model import GuardedLlama


class IntegrityEngine:
    def __init__(self, cfg: IntegrityConfig, device_index: int = 0) -> None:
        self.cfg = cfg
        self.device = torch.device("cuda", device_index)
        total = cfg.num_pages + cfg.spare_pages
        self.kv_cache = torch.zeros(cfg.num_layers, total, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim,
                                    dtype=torch.bfloat16, device=self.device)
        self.records = ChecksumRecords(total)
        self.quarantine = QuarantineSet(cfg.num_pages, cfg.spare_pages)
        self.scanner = IntegrityScanner(cfg, self.kv_cache, self.records, self.quarantine, self.device,
                                        cfg.scan_every)
        self.backend = ScannerBackend(cfg, self.device)
        self.model = GuardedLlama(cfg, self.backend).to(self.device)
        self.graphs = DecodeGraphs(self.model, self.backend, cfg, self.device)
        self.page_lists: Dict[int, List[int]] = {}
        self.indptr_pinned = torch.zeros(cfg.max_batch + 1, dtype=torch.int32, pin_memory=True)
        self.last_pinned = torch.zeros(cfg.max_batch, dtype=torch.int32, pin_memory=True)
        self.indices_staging = torch.zeros(cfg.max_pages_per_step, dtype=torch.int32, device=self.device)
        self.step_idx = 0

    def warmup(self) -> None:
        self.graphs.record_buckets(self.kv_cache)

    def rebuild_tables(self, slots: List[int], kv_lens_cpu: torch.Tensor) -> PageTable:
        for old in sorted(self.quarantine.pages - self.quarantine.remapped):
            new = self.quarantine.take_spare()
            self.kv_cache[:, new].zero_()
            self.backend.remap_quarantined(old, new)
            for pages in self.page_lists.values():
                pages[:] = [new if p == old else p for p in pages]
            self.quarantine.remapped.add(old)
        lists = [self.page_lists[s] for s in slots]
        return self.quarantine.rebuild_page_table(lists, kv_lens_cpu.numpy(), self.cfg.page_size, self.device)

    def step(self, slots: List[int], input_ids_cpu: torch.Tensor, kv_lens_cpu: torch.Tensor) -> torch.Tensor:
        self.step_idx += 1
        n_bad = self.scanner.maybe_scan(self.step_idx)
        rebuilt: Optional[PageTable] = None
        if n_bad:
            self.scanner.scan_done.synchronize()  # expect: FC101
            rebuilt = self.rebuild_tables(slots, kv_lens_cpu)
        meta = build_step_meta([self.page_lists[s] for s in slots], kv_lens_cpu, self.cfg.page_size,
                               self.indptr_pinned, self.last_pinned, self.indices_staging)
        meta.rebuilt = rebuilt
        n = meta.batch_size
        bs = self.graphs.bucket_for(n)
        if bs is None:
            self.backend.plan_eager(meta)
            return self.model(input_ids_cpu.to(self.device, non_blocking=True), meta.positions, self.kv_cache)
        self.backend.prepare_bucket(bs, meta)
        self.graphs.static_ids[:n].copy_(input_ids_cpu, non_blocking=True)
        self.graphs.static_pos[:n].copy_(meta.positions)
        return self.graphs.launch(bs)[:n]

    def record_written(self, page_ids_np: np.ndarray, sums_np: np.ndarray) -> None:
        self.records.record(page_ids_np, sums_np)
