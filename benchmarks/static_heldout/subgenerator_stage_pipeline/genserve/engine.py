"""The driver: pumps the step generator, answers its requests, retires finished sequences."""

from __future__ import annotations

from typing import Any, List, Tuple

import numpy as np
import torch

from .attention import AttentionBackend
from .batch import PageGrant, Request, StageEvent, StepOutput
from .buffers import StepBuffers
from .config import EngineConfig
from .graphs import GraphRunner
from .model import TinyDecoder
from .pipeline import StagePipeline


class PagePool:
    def __init__(self, num_pages: int) -> None:
        self.free_pages = np.arange(num_pages - 1, -1, -1, dtype=np.int32)
        self.top = num_pages

    def alloc(self, n: int) -> np.ndarray:
        if n > self.top:
            return np.full(max(n, 1), -1, dtype=np.int32)
        self.top -= n
        return self.free_pages[self.top : self.top + n].copy()

    def free(self, pages: List[int]) -> None:
        n = len(pages)
        self.free_pages[self.top : self.top + n] = pages
        self.top += n


class Engine:
    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.bufs = StepBuffers(cfg)
        self.backend = AttentionBackend(cfg, self.bufs)
        self.model = TinyDecoder(cfg, self.backend).to(device=self.device, dtype=cfg.dtype)
        self.graphs = GraphRunner(cfg, self.model, self.backend, self.bufs)
        self.pipeline = StagePipeline(cfg, self.backend, self.model, self.graphs, self.bufs)
        self.pool = PagePool(cfg.num_pages)
        self.active: List[Request] = []

    def warmup(self) -> None:
        self.backend.init_graph_buffers()
        self.backend.init_graph_wrappers()
        self.graphs.capture_all()

    def submit(self, req: Request) -> None:
        if req.prompt_len + req.max_new_tokens > self.cfg.max_seq_len:
            raise ValueError(f"request {req.rid}: {req.prompt_len} + {req.max_new_tokens} > {self.cfg.max_seq_len}")
        self.active.append(req)

    def _answer(self, event: StageEvent) -> Any:
        if event.kind == "alloc":
            ids_cpu = torch.from_numpy(self.pool.alloc(event.payload)).pin_memory()
            return PageGrant(page_ids_cpu=ids_cpu, page_ids=ids_cpu.to(self.device, non_blocking=True))
        return None

    def drive_step(self) -> List[Tuple[int, int]]:
        gen = self.pipeline.step(self.active)
        reply: Any = None
        while True:
            try:
                event = gen.send(reply)
            except StopIteration as stop:
                out: StepOutput = stop.value
                break
            reply = self._answer(event)

        emitted: List[Tuple[int, int]] = []
        finished: List[Request] = []
        tokens = out.next_tokens.tolist()  # expect: FC101
        for req, tok in zip(out.requests, tokens):
            req.output_ids.append(tok)
            emitted.append((req.rid, tok))
            if req.finished:
                finished.append(req)
        if finished:
            self.release_finished(finished)
        return emitted

    def release_finished(self, finished: List[Request]) -> None:
        freed: List[int] = []
        for req in finished:
            self.active.remove(req)
            freed.extend(req.pages)
            self.pool.free(req.pages)
            req.pages = []
        # stage the freed page ids on the device (the index table is large enough) and scrub their KV
        scratch = self.backend.kv_indices[: len(freed)]
        scratch.copy_(torch.tensor(freed, dtype=torch.int32), non_blocking=True)  # expect: FC104
        self.backend.kv_cache.zero_pages(scratch)

    def serve_forever(self) -> None:
        while self.active:
            self.drive_step()
