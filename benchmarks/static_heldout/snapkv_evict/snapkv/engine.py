"""The serving step: decode, score, evict, compact."""

import threading
import time
from dataclasses import dataclass
from typing import Dict, List

import torch

from snapkv.attn_backend import SnapDecodeBackend
from snapkv.config import SnapConfig
from snapkv.model import SnapDecoder
from snapkv.page_table import PageTable
from snapkv.runner.graph_runner import DecodeGraphRunner
from snapkv.scoring import ObservationWindowScorer


@dataclass
class DecodeBatch:
    bs: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    rows_cpu: torch.Tensor
    request_ids: List[int]


class SnapEngine:
    def __init__(self, cfg: SnapConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.table = PageTable(cfg.max_batch_size, cfg.max_pages_per_req, cfg.num_pages, cfg.page_size, device)
        self.scorer = ObservationWindowScorer(cfg, device)
        self.backend = SnapDecodeBackend(cfg, self.table, device)
        kv_caches = [
            torch.zeros(cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16, device=device)
            for _ in range(cfg.num_layers)
        ]
        page_key_means = torch.zeros(
            cfg.num_layers, cfg.max_batch_size, cfg.max_pages_per_req, cfg.num_qo_heads, cfg.head_dim,
            dtype=torch.bfloat16, device=device,
        )
        self.model = SnapDecoder(cfg, self.backend, kv_caches, page_key_means).to(device)
        self.runner = DecodeGraphRunner(cfg, self.model, self.backend, device)
        self.out_pinned = torch.zeros(cfg.max_batch_size, dtype=torch.long, pin_memory=True)
        self.done_event = torch.cuda.Event()
        self.copy_done = torch.cuda.Event()
        self.step_id = 0
        self._stop = threading.Event()
        self._reclaimer = None

    def start(self) -> None:
        self.runner.record_all()
        self._reclaimer = threading.Thread(target=self._reclaim_loop, daemon=True)
        self._reclaimer.start()

    def step(self, batch: DecodeBatch) -> torch.Tensor:
        bs = batch.bs
        rows_gpu = batch.rows_cpu.to(self.device, non_blocking=True)
        if bs <= self.runner.max_bs:
            logits, mass = self.runner.replay(bs, batch.input_ids, batch.positions, batch.seq_lens, batch.rows_cpu, rows_gpu)
        else:
            self.backend.init_forward_metadata(bs, batch.rows_cpu, rows_gpu)
            logits, mass = self.model.decode(batch.input_ids, batch.positions, bs, in_graph=False)
        page_counts = self.table.page_counts[rows_gpu]
        self.scorer.accumulate(mass, page_counts, bs)
        self.step_id += 1
        if self.step_id % self.cfg.evict_interval == 0:
            self.scorer.select_victims(bs, page_counts)
            if self.scorer.state.num_evictable > 0:
                self._evict(bs, batch.rows_cpu)
        next_ids = torch.argmax(logits, dim=-1)
        self.out_pinned[:bs].copy_(next_ids, non_blocking=True)
        self.done_event.record()
        lens_now = self.table.page_counts_cpu[batch.rows_cpu].tolist()  # ok: FC101
        self._pages_last_step = sum(lens_now)
        return self.out_pinned[:bs]

    def _evict(self, bs: int, rows_cpu: torch.Tensor) -> None:
        rows = rows_cpu.tolist()
        for i, row in enumerate(rows):
            kept, new_n = self.table.compact_row(row, self.scorer.score_accum[i], self.cfg.budget_pages)
            start = int(self.backend.kv_indptr_cpu[i])
            # patch the page list the bucket graph reads, so the next replay sees the compacted row
            self.backend.cuda_graph_kv_indices[start : start + new_n].copy_(kept)  # expect: FC104
        self.copy_done.record()

    def _reclaim_loop(self) -> None:
        # runs on its own thread: returns evicted pages to the pool once the victim copy landed
        while not self._stop.is_set():
            self.copy_done.synchronize()  # ok: FC101
            victims = self.scorer.state.victims_pinned.tolist()
            for row_victims in victims:
                self.table.release([p for p in row_victims if p >= 0])
            time.sleep(0.002)

    def memory_report(self) -> Dict[str, int]:
        return {
            "kv_pages_free": len(self.table.free_pages),
            "decode_workspace_bytes": self.backend.eager_decode._float_workspace_buffer.numel(),  # expect: FC103
            "graph_buckets": len(self.runner.graphs),
        }

    def shutdown(self) -> None:
        self._stop.set()
        if self._reclaimer is not None:
            self._reclaimer.join()
