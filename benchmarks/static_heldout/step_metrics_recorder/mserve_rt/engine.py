"""Scheduler loop: builds a ForwardBatch per step from host state and runs the model."""

from __future__ import annotations

import collections
import dataclasses
from typing import Deque, List

import numpy as np
import torch

from mserve.config import EngineConfig
from mserve.forward_batch import ForwardBatch, ForwardMode

from .model_runner import ModelRunner


@dataclasses.dataclass
class Req:
    rid: int
    tokens: List[int]
    max_new_tokens: int
    slot: int = -1
    prompt_len: int = 0
    prefilled: bool = False

    @property
    def done(self) -> bool:
        return len(self.tokens) - self.prompt_len >= self.max_new_tokens


class Engine:
    def __init__(self, cfg: EngineConfig, device: str = "cuda"):
        self.cfg = cfg
        self.runner = ModelRunner(cfg, device)
        self.device = self.runner.device
        self.waiting: Deque[Req] = collections.deque()
        self.running: List[Req] = []
        self.free_slots = list(range(cfg.max_running_requests - 1, -1, -1))
        self.step_id = 0

    def add(self, rid: int, prompt: List[int], max_new_tokens: int = 128) -> None:
        self.waiting.append(Req(rid, list(prompt), max_new_tokens, prompt_len=len(prompt)))

    def _batch(self, reqs: List[Req], mode: ForwardMode) -> ForwardBatch:
        pool = self.runner.pool
        if mode == ForwardMode.DECODE:
            lens = np.array([len(r.tokens) for r in reqs], dtype=np.int32)
            ids = np.array([r.tokens[-1] for r in reqs], dtype=np.int64)
            pos = lens.astype(np.int64) - 1
            locs = np.array([pool.slot_of(r.slot, len(r.tokens) - 1) for r in reqs], dtype=np.int64)
            qo_cpu = None
        else:
            lens = np.array([len(r.tokens) for r in reqs], dtype=np.int32)
            ids = np.concatenate([np.asarray(r.tokens, dtype=np.int64) for r in reqs])
            pos = np.concatenate([np.arange(n, dtype=np.int64) for n in lens])
            locs = np.array([pool.slot_of(r.slot, p) for r in reqs for p in range(len(r.tokens))], dtype=np.int64)
            qo = np.zeros(len(reqs) + 1, dtype=np.int32)
            np.cumsum(lens, out=qo[1:])
            qo_cpu = torch.from_numpy(qo)
        dev = self.device
        return ForwardBatch(
            forward_mode=mode,
            batch_size=len(reqs),
            step_id=self.step_id,
            input_ids=torch.from_numpy(ids).to(dev, non_blocking=True),
            positions=torch.from_numpy(pos).to(dev, non_blocking=True),
            req_pool_indices=torch.tensor([r.slot for r in reqs], dtype=torch.int64, device=dev),
            seq_lens=torch.from_numpy(lens).to(dev, non_blocking=True),
            seq_lens_cpu=torch.from_numpy(lens),
            out_cache_loc=torch.from_numpy(locs).to(dev, non_blocking=True),
            qo_indptr=None if qo_cpu is None else qo_cpu.to(dev),
            qo_indptr_cpu=qo_cpu,
            extend_num_tokens=0 if qo_cpu is None else int(lens.sum()),
        )

    def step(self) -> None:
        self.step_id += 1
        new = []
        while self.waiting and self.free_slots:
            r = self.waiting[0]
            slot = self.free_slots[-1]
            if not self.runner.pool.reserve(slot, len(r.tokens) + r.max_new_tokens):
                break
            self.waiting.popleft()
            r.slot = self.free_slots.pop()
            new.append(r)
        if new:
            fb = self._batch(new, ForwardMode.EXTEND)
            qo = fb.qo_indptr_cpu.numpy()
            last_rows = torch.from_numpy(qo[1:].astype(np.int64) - 1).to(self.device)
            logits = self.runner.forward(fb, last_rows)
            self._append(new, logits)
            self.running.extend(new)
        elif self.running:
            fb = self._batch(self.running, ForwardMode.DECODE)
            logits = self.runner.forward(fb, None)
            self._append(self.running, logits)
        self._retire()

    def _append(self, reqs: List[Req], logits: torch.Tensor) -> None:
        for r, tok in zip(reqs, logits.argmax(dim=-1).tolist()):
            r.tokens.append(tok)

    def _retire(self) -> None:
        keep = []
        for r in self.running:
            if r.done:
                self.runner.pool.release(r.slot)
                self.free_slots.append(r.slot)
            else:
                keep.append(r)
        self.running = keep
