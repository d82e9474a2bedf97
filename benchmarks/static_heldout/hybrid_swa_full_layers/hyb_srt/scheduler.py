"""Continuous batching over both pools; prefill and decode steps alternate."""

from __future__ import annotations

import collections
from typing import Deque, Dict, List, Tuple

import numpy as np
import torch

from hyb_srt.model_runner import ModelRunner
from hyb_srt.window_evictor import SwaWindowEvictor
from swahybrid.metadata import ForwardBatch


class Scheduler:
    def __init__(self, runner: ModelRunner, max_new_tokens: int = 512) -> None:
        self.runner = runner
        self.pools = runner.pools
        self.evictor = SwaWindowEvictor(runner.pools, runner.attn_backend)
        self.max_new_tokens = max_new_tokens
        self.waiting: Deque[Tuple[int, List[int]]] = collections.deque()
        self.running: Dict[int, int] = {}  # rid -> last token
        self.generated: Dict[int, List[int]] = collections.defaultdict(list)
        self.prefill_turn = True

    def add_request(self, rid: int, prompt: List[int]) -> None:
        if not prompt:
            raise ValueError(f"request {rid} has an empty prompt")
        self.waiting.append((rid, prompt))

    def _to_dev(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).pin_memory().to(self.runner.device, non_blocking=True)

    def _prefill_batch(self) -> ForwardBatch:
        reqs = [self.waiting.popleft() for _ in range(min(len(self.waiting), 8))]
        ids, pos, full_loc, swa_loc, lens = [], [], [], [], []
        for rid, prompt in reqs:
            self.pools.admit(rid, len(prompt))
            ids.extend(prompt)
            pos.extend(range(len(prompt)))
            lens.append(len(prompt))
            full_pages = self.pools.full.pages[rid]
            swa_pages = self.pools.swa.pages[rid]
            first = self.pools.swa.first_pos[rid]
            ps = self.pools.page_size
            full_loc.extend(full_pages[i // ps] * ps + i % ps for i in range(len(prompt)))
            swa_loc.extend(
                swa_pages[(i - first) // ps] * ps + i % ps if i >= first else 0 for i in range(len(prompt))
            )
        qo = np.zeros(len(reqs) + 1, dtype=np.int32)
        np.cumsum(lens, out=qo[1:])
        seq = np.asarray(lens, np.int32)
        return ForwardBatch(
            rids=[rid for rid, _ in reqs],
            is_decode=False,
            input_ids=self._to_dev(np.asarray(ids, np.int64)),
            positions=self._to_dev(np.asarray(pos, np.int64)),
            full_loc=self._to_dev(np.asarray(full_loc, np.int64)),
            swa_loc=self._to_dev(np.asarray(swa_loc, np.int64)),
            seq_lens=self._to_dev(seq),
            seq_lens_cpu=torch.from_numpy(seq).pin_memory(),
            qo_indptr_cpu=torch.from_numpy(qo).pin_memory(),
        )

    def _decode_batch(self) -> ForwardBatch:
        rids = list(self.running)
        locs = [self.pools.grow(rid) for rid in rids]
        seq = np.array([self.pools.lens[r] for r in rids], dtype=np.int32)
        return ForwardBatch(
            rids=rids,
            is_decode=True,
            input_ids=self._to_dev(np.array([self.running[r] for r in rids], np.int64)),
            positions=self._to_dev((seq - 1).astype(np.int64)),
            full_loc=self._to_dev(np.array([f for f, _ in locs], np.int64)),
            swa_loc=self._to_dev(np.array([s for _, s in locs], np.int64)),
            seq_lens=self._to_dev(seq),
            seq_lens_cpu=torch.from_numpy(seq).pin_memory(),
        )

    def run_once(self) -> None:
        prefill = self.prefill_turn and bool(self.waiting)
        self.prefill_turn = not self.prefill_turn
        if not prefill and not self.running:
            return
        fb = self._prefill_batch() if prefill else self._decode_batch()
        logits = self.runner.forward(fb)
        next_ids = torch.argmax(logits, dim=-1).tolist()  # ok: FC101
        for rid, tok in zip(fb.rids, next_ids):
            self.running[rid] = tok
            self.generated[rid].append(tok)
            if len(self.generated[rid]) >= self.max_new_tokens:
                del self.running[rid]
                self.evictor.release(rid)
