"""One engine step: aborts, scheduling, compaction, decode (graph or eager), prefill, sampling."""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Deque, Dict, List, Tuple

import numpy as np
import torch

from sloserve.attn import SlotAttnBackend
from sloserve.config import GRAPH_BUCKETS, EngineConfig
from sloserve.metrics import SloMetrics
from sloserve.model import SloModel, StepBatch
from sloserve.request import AbortRegistry, Request
from sloserve.runner import SloGraphRunner
from sloserve.scheduler import SloScheduler, StepPlan
from sloserve.slots import SlotTable

logger = logging.getLogger(__name__)


class SloEngine:
    def __init__(self, cfg: EngineConfig, num_pages: int, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.slots = SlotTable(cfg, num_pages, device)
        self.attn = SlotAttnBackend(cfg, self.slots, device)
        self.model = SloModel(cfg, self.attn, num_pages, device).to(device)
        self.runner = SloGraphRunner(self)
        self.scheduler = SloScheduler(cfg, self.slots)
        self.aborts = AbortRegistry()
        self.metrics = SloMetrics()
        self.eos_token_id = cfg.eos_token_id
        self.pending: Deque[Tuple[torch.Tensor, torch.Tensor]] = deque()
        self.step_ms_host = torch.zeros(0, dtype=torch.float32)

    # ------------------------------------------------------------------ API thread
    def submit(self, req: Request) -> None:
        self.scheduler.add_request(req)

    def report_memory(self) -> Dict[str, int]:
        """Called by the admin endpoint."""
        float_bytes = self.attn.decode_workspace.numel() + self.attn.prefill_workspace.numel()
        int_bytes = sum(w._int_workspace_buffer.numel() for w in self.attn.graph_wrappers.values())  # expect: FC103
        return {"float_workspace": float_bytes, "int_workspace": int_bytes, "graphs": len(self.runner.graphs)}

    # ------------------------------------------------------------------ step
    def _decode_batch(self, step: StepPlan) -> StepBatch:
        rows_np = step.decode_rows.astype(np.int64)
        lens_np = step.decode_seq_lens_np.astype(np.int64)
        last_tok = [self._last_token(r) for r in self._rids_of(rows_np)]
        pages = self.slots.page_table_np[rows_np, (np.maximum(lens_np, 1) - 1) // self.cfg.page_size]
        out_loc = pages.astype(np.int64) * self.cfg.page_size + (np.maximum(lens_np, 1) - 1) % self.cfg.page_size
        dev = self.device
        return StepBatch(
            batch_size=len(rows_np),
            input_ids=torch.tensor(last_tok, dtype=torch.int64).to(dev, non_blocking=True),
            positions=torch.from_numpy(np.maximum(lens_np - 1, 0)).to(dev, non_blocking=True),
            rows=torch.from_numpy(rows_np).to(dev, non_blocking=True),
            seq_lens=torch.from_numpy(lens_np.astype(np.int32)).to(dev, non_blocking=True),
            out_loc=torch.from_numpy(out_loc).to(dev, non_blocking=True),
        )

    def _last_token(self, rid: int) -> int:
        req = self.scheduler.requests.get(rid)
        if req is None:
            return 0  # a hole: its token is thrown away
        return req.output_ids[-1] if req.output_ids else req.prompt_ids[-1]

    def _prefill_batch(self, step: StepPlan) -> StepBatch:
        ps = self.cfg.page_size
        ext_np = np.diff(step.prefill_qo_indptr_np)
        pos_np = np.concatenate(
            [np.arange(p, p + n, dtype=np.int64) for p, n in zip(step.prefill_prefix_np.tolist(), ext_np.tolist())]
        )
        row_np = np.repeat(step.prefill_rows.astype(np.int64), ext_np)
        loc_np = self.slots.page_table_np[row_np, pos_np // ps].astype(np.int64) * ps + pos_np % ps
        dev = self.device
        return StepBatch(
            batch_size=len(step.prefill_rows),
            input_ids=torch.from_numpy(step.prefill_token_ids).to(dev, non_blocking=True),
            positions=torch.from_numpy(pos_np).to(dev, non_blocking=True),
            rows=torch.from_numpy(step.prefill_rows.astype(np.int64)).to(dev, non_blocking=True),
            seq_lens=torch.from_numpy((step.prefill_prefix_np + ext_np).astype(np.int32)).to(dev, non_blocking=True),
            out_loc=torch.from_numpy(loc_np).to(dev, non_blocking=True),
        )

    def _rids_of(self, rows_np: np.ndarray) -> List[int]:
        by_slot = {s: r for r, s in self.slots.slot_of.items()}
        return [by_slot.get(int(s), -1) for s in rows_np.tolist()]

    def _apply_aborts(self, rids: List[int]) -> None:
        rows = [self.slots.slot_of[r] for r in rids if r in self.slots.slot_of]
        for rid in rids:
            self.scheduler.abort(rid)
        if rows:
            # the aborted rows stay in the batch as holes until compaction: make them read one token
            rows_t = torch.tensor(rows, dtype=torch.int64, device=self.device)
            self.attn.kv_last_page_len[rows_t] = 1  # expect: FC104

    def step(self) -> None:
        t0 = time.perf_counter()
        aborted = self.aborts.drain()
        if aborted:
            self._apply_aborts(aborted)
        step = self.scheduler.schedule(t0 * 1e3)
        if step.needs_compaction:
            moves = self.slots.compact()
            logger.debug("compacted %d rows", len(moves))
            self.runner.static_seq_lens = torch.ones(self.runner.max_bs, dtype=torch.int32, device=self.device)  # expect: FC107
            step = self.scheduler.schedule(t0 * 1e3)

        sampled: List[Tuple[torch.Tensor, torch.Tensor]] = []
        if step.num_decode:
            fb = self._decode_batch(step)
            if step.num_decode <= max(GRAPH_BUCKETS):
                logits = self.runner.replay(fb, step)
            else:
                self.attn.plan_decode_eager(step)
                logits = self.model.run_step(fb, decode=True)
            next_tokens = logits.argmax(dim=-1)
            done_rows = fb.rows[next_tokens == self.eos_token_id]  # expect: FC101
            sampled.append((next_tokens, done_rows))
        if len(step.prefill_rows):
            self.attn.plan_prefill(step)
            fbp = self._prefill_batch(step)
            logits_p = self.model.run_step(fbp, decode=False)
            sampled.append((logits_p.argmax(dim=-1), fbp.rows[:0]))
        self.pending.extend(sampled)

        done = torch.cuda.Event()
        done.record()
        self.metrics.push(done, self._rids_of(step.decode_rows), [])
        step_ms = torch.tensor([(time.perf_counter() - t0) * 1e3], dtype=torch.float32)
        self.step_ms_host = torch.cat([self.step_ms_host[-1023:], step_ms])  # ok: FC107
