"""Owns the page table, the backend, the model and the graphs; runs one scheduler step at a time."""

from __future__ import annotations

from collections import deque
from typing import Deque, Tuple

import numpy as np
import torch

from dcaserve.backend import DualChunkBackend
from dcaserve.batch import DCAForwardBatch, ScheduledBatch
from dcaserve.config import DCAConfig
from dcaserve.graph_runner import DCAGraphRunner
from dcaserve.model import DCAKVCache, DCAModel
from dcaserve.pages import DCAPageTable
from dcaserve.positions import decode_query_positions, key_positions


class DCAModelRunner:
    def __init__(self, cfg: DCAConfig, device: torch.device, num_pages: int):
        self.cfg = cfg
        self.device = device
        self.page_table = DCAPageTable(num_pages, 4 * cfg.max_batch_size, cfg.page_size, cfg.chunk_size, device)
        self.backend = DualChunkBackend(cfg, self.page_table, device)
        self.kv = DCAKVCache(cfg, num_pages, device)
        self.model = DCAModel(cfg, self.backend, self.kv).to(device)
        self.backend.warmup_kernels()
        self.graph_runner = DCAGraphRunner(self)
        self.eos_token_id = cfg.eos_token_id
        self.sampled: Deque[Tuple[torch.Tensor, torch.Tensor]] = deque()
        self.step_count = 0

    def profile_kv_cache(self) -> float:
        """Start-up check that the freshly allocated cache reads back as zeros."""
        torch.cuda.synchronize()
        return self.kv.layers[0].float().abs().max().item()  # ok: FC101

    # ------------------------------------------------------------------ batch building
    def _build_forward_batch(self, batch: ScheduledBatch) -> DCAForwardBatch:
        c = self.cfg
        dev = self.device
        slots, locs = [], []
        extend_np = batch.seq_lens_np - batch.prefix_lens_np
        for rid, prefix, n in zip(batch.rids, batch.prefix_lens_np.tolist(), extend_np.tolist()):
            self.page_table.grow(rid, prefix + n)
            pages = self.page_table.req_pages[rid]
            slots.append(self.page_table.req_slot[rid])
            locs.extend(pages[p // c.page_size] * c.page_size + p % c.page_size for p in range(prefix, prefix + n))
        qo_indptr_np = np.zeros(len(batch.rids) + 1, dtype=np.int32)
        np.cumsum(extend_np, out=qo_indptr_np[1:])
        kv_cu_np = np.zeros_like(qo_indptr_np)
        np.cumsum(batch.seq_lens_np, out=kv_cu_np[1:])
        if batch.is_decode:
            qpos = decode_query_positions(batch.seq_lens_np, c.chunk_size)
            intra_np, inter_np = qpos.intra, qpos.inter
        else:
            intra_np = key_positions(batch.prefix_lens_np, extend_np, c.chunk_size)
            inter_np = np.full_like(intra_np, c.chunk_size - 1)
        return DCAForwardBatch(
            rids=list(batch.rids),
            is_decode=batch.is_decode,
            batch_size=len(batch.rids),
            input_ids=torch.from_numpy(batch.input_ids_np).to(dev, non_blocking=True),
            out_cache_loc=torch.tensor(locs, dtype=torch.int64).to(dev, non_blocking=True),
            intra_pos=torch.from_numpy(intra_np).to(dev, non_blocking=True),
            inter_pos=torch.from_numpy(inter_np).to(dev, non_blocking=True),
            key_pos=torch.from_numpy(key_positions(batch.prefix_lens_np, extend_np, c.chunk_size)).to(dev, non_blocking=True),
            seq_lens=torch.from_numpy(batch.seq_lens_np).to(dev, non_blocking=True),
            seq_lens_np=batch.seq_lens_np,
            prefix_lens_np=batch.prefix_lens_np,
            slots=torch.tensor(slots, dtype=torch.int64).to(dev, non_blocking=True),
            qo_indptr=torch.from_numpy(qo_indptr_np).to(dev, non_blocking=True),
            qo_indptr_np=qo_indptr_np,
            kv_cu_seqlens=torch.from_numpy(kv_cu_np).to(dev, non_blocking=True),
            max_q_len=int(extend_np.max()),
            max_kv_len=int(batch.seq_lens_np.max()),
        )

    # ------------------------------------------------------------------ step
    def forward_step(self, batch: ScheduledBatch) -> torch.Tensor:
        fb = self._build_forward_batch(batch)
        if self.graph_runner.can_run(fb):
            logits = self.graph_runner.replay(fb)
        else:
            self.backend.init_forward_metadata(fb)
            if fb.is_decode:
                logits = self.model.forward_decode(fb.input_ids, fb)
            else:
                logits = self.model.forward_extend(fb.input_ids, fb)
        next_ids = torch.argmax(logits, dim=-1)
        finished = torch.nonzero(next_ids == self.eos_token_id)  # expect: FC101
        self.sampled.append((next_ids, finished))
        if batch.crossed_boundary:
            self._carry_boundary_pages(batch)
        self.step_count += 1
        if self.step_count % 512 == 0:
            self.page_table.audit()
        return next_ids

    def _carry_boundary_pages(self, batch: ScheduledBatch) -> None:
        """Rows that crossed into a new chunk: their old intra pages are now the succ stream.

        Shift them over now so the next replay only has to copy the fresh intra pages.
        """
        n = batch.prev_intra_nnz
        self.backend.kv_indices["succ"][:n].copy_(self.backend.kv_indices["intra"][:n])  # expect: FC104


def launch(cfg: DCAConfig, num_pages: int) -> DCAModelRunner:
    runner = DCAModelRunner(cfg, torch.device("cuda"), num_pages)
    if runner.profile_kv_cache() != 0.0:
        raise RuntimeError("KV cache was not zero-initialised")
    runner.graph_runner.capture_all()
    return runner
