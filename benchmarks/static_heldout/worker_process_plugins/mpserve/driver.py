"""The driver process: scheduling and page allocation into the shared mirror (numpy
only), a ``StepMessage`` down each worker's pipe, sampled tokens folded back."""

from __future__ import annotations

import itertools
import logging
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Deque, List, Optional

import multiprocessing as mp
import numpy as np
import torch

from .batch import StepMessage
from .config import EngineConfig
from .shm import HostMirror, MirrorLayout
from .worker import run_worker

logger = logging.getLogger(__name__)


@dataclass
class Request:
    rid: int
    prompt: List[int]
    max_new_tokens: int
    output: List[int] = field(default_factory=list)
    pages: List[int] = field(default_factory=list)
    num_computed: int = 0

    @property
    def seq_len(self) -> int:
        return len(self.prompt) + len(self.output)

    def pending_tokens(self) -> List[int]:
        return (self.prompt + self.output)[self.num_computed:]


class Driver:
    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self.ctx = mp.get_context("spawn")
        self.mirror = HostMirror.create(MirrorLayout.from_config(cfg))
        self.events = self.ctx.Queue()
        self.conns: List[Connection] = []
        self.procs = []
        for rank in range(cfg.world_size):
            parent, child = self.ctx.Pipe()
            proc = self.ctx.Process(
                target=run_worker,
                args=(rank, cfg, child, self.mirror.name, self.events),
                name=f"mpserve-worker-{rank}",
                daemon=True,
            )
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)
        for _ in range(cfg.world_size):
            kind, rank, backend = self.events.get(timeout=600)
            logger.info("worker %d %s with backend %s", rank, kind, backend)
        self.free_pages: Deque[int] = deque(range(cfg.max_num_pages))
        self.waiting: Deque[Request] = deque()
        self.running: List[Request] = []
        self.finished: List[Request] = []
        self.output_tokens_cpu = torch.zeros(0, dtype=torch.long)
        self._ids = itertools.count()
        self._step_ids = itertools.count()

    def add_request(self, prompt: List[int], max_new_tokens: int = 128) -> int:
        if not prompt or len(prompt) + max_new_tokens > self.cfg.max_seq_len:
            raise ValueError(f"prompt of {len(prompt)} tokens does not fit max_seq_len={self.cfg.max_seq_len}")
        req = Request(next(self._ids), list(prompt), max_new_tokens)
        self.waiting.append(req)
        return req.rid

    def capture(self) -> List[int]:
        for conn in self.conns:
            conn.send(("capture", None))
        replies = [conn.recv() for conn in self.conns]
        return replies[0][1]

    def _ensure_pages(self, req: Request) -> None:
        page = self.cfg.page_size
        need = (req.seq_len + page - 1) // page - len(req.pages)
        for _ in range(max(need, 0)):
            req.pages.append(self.free_pages.popleft())

    def schedule_step(self) -> Optional[StepMessage]:
        cfg = self.cfg
        while self.waiting and len(self.running) < cfg.max_batch_size:
            self.running.append(self.waiting.popleft())
        if not self.running:
            return None
        batch = self.running
        bs = len(batch)
        m = self.mirror
        page = cfg.page_size
        for req in batch:
            self._ensure_pages(req)
        is_decode = all(r.num_computed > 0 for r in batch)
        lens = np.fromiter((r.seq_len for r in batch), dtype=np.int32, count=bs)
        q_lens = np.fromiter((len(r.pending_tokens()) for r in batch), dtype=np.int32, count=bs)
        m.seq_lens_np[:bs] = lens
        m.num_computed_np[:bs] = lens - q_lens
        m.qo_indptr_np[0] = 0
        np.cumsum(q_lens, out=m.qo_indptr_np[1 : bs + 1])
        m.kv_indptr_np[0] = 0
        np.cumsum((lens + page - 1) // page, out=m.kv_indptr_np[1 : bs + 1])
        m.kv_last_page_len_np[:bs] = (lens - 1) % page + 1
        nnz = int(m.kv_indptr_np[bs])
        m.kv_indices_np[:nnz] = np.concatenate([np.asarray(r.pages, dtype=np.int32) for r in batch])
        num_tokens = int(m.qo_indptr_np[bs])
        m.token_ids_np[:num_tokens] = np.concatenate([np.asarray(r.pending_tokens(), dtype=np.int32) for r in batch])
        m.positions_np[:num_tokens] = np.concatenate(
            [np.arange(r.num_computed, r.seq_len, dtype=np.int32) for r in batch]
        )
        seq_lens_t = torch.from_numpy(m.seq_lens_np[:bs])
        if seq_lens_t.max() > cfg.max_seq_len:  # ok: FC101
            raise RuntimeError(f"scheduled a sequence past max_seq_len={cfg.max_seq_len}")
        return StepMessage(next(self._step_ids), bs, num_tokens, is_decode)

    def record_tokens(self, tokens: List[int]) -> None:
        new = torch.tensor(tokens, dtype=torch.long)
        self.output_tokens_cpu = torch.cat([self.output_tokens_cpu, new])  # ok: FC107
        done: List[Request] = []
        for req, tok in zip(self.running, tokens):
            req.num_computed = req.seq_len
            req.output.append(tok)
            if tok == self.cfg.eos_token_id or len(req.output) >= req.max_new_tokens:
                done.append(req)
        for req in done:
            self.running.remove(req)
            self.free_pages.extend(req.pages)
            req.pages = []
            self.finished.append(req)

    def step(self) -> int:
        msg = self.schedule_step()
        if msg is None:
            return 0
        for conn in self.conns:
            conn.send(("step", msg))
        replies = [conn.recv() for conn in self.conns]
        kind, tokens = replies[0]
        if kind != "tokens":
            raise RuntimeError(f"worker 0 answered {kind!r} to step {msg.step_id}")
        self.record_tokens(tokens)
        return len(tokens)

    def shutdown(self) -> None:
        for conn in self.conns:
            conn.send(("shutdown", None))
        for conn, proc in zip(self.conns, self.procs):
            conn.recv()
            proc.join(timeout=30)
        self.mirror.close()

