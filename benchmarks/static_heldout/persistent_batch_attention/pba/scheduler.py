"""Token-budget scheduler: decode rows first, then prefill chunks, a long prompt's tail split off."""

from collections import deque
from dataclasses import dataclass, field
from typing import Deque, List, Optional

import torch

from pba.batch_info import MixedBatchInfo, StepScratch, build_batch_info
from pba.config import EngineConfig


@dataclass
class Request:
    rid: int
    prompt: List[int]
    pages: List[int] = field(default_factory=list)
    num_computed: int = 0
    output: List[int] = field(default_factory=list)

    @property
    def kv_len(self) -> int:
        return self.num_computed


@dataclass
class ScheduledStep:
    requests: List[Request]
    info: MixedBatchInfo
    input_ids: torch.Tensor
    scratch: StepScratch
    tail: Optional[MixedBatchInfo] = None
    aborted: bool = False


class HolisticScheduler:
    def __init__(self, cfg: EngineConfig, max_batch: int, chunk_size: int, page_size: int, device: torch.device):
        assert chunk_size % page_size == 0  # expect: FC109
        self.cfg = cfg
        self.max_batch = max_batch
        self.chunk_size = chunk_size
        self.page_size = page_size
        self.device = device
        self.waiting: Deque[Request] = deque()
        self.running: List[Request] = []
        self.free_pages: List[int] = list(range(1, cfg.num_pages))
        self.pages_in_use = 0
        self.aborts: List[int] = []

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def _grow(self, req: Request, new_tokens: int) -> None:
        need = (req.kv_len + new_tokens + self.page_size - 1) // self.page_size - len(req.pages)
        for _ in range(max(need, 0)):
            req.pages.append(self.free_pages.pop())
        self.pages_in_use += max(need, 0)
        self._check_free_pages()

    def _check_free_pages(self) -> None:
        assert self.pages_in_use + len(self.free_pages) == self.cfg.num_pages - 1  # ok: FC109

    def schedule_step(self) -> ScheduledStep:
        # the previous step's KV writes must land before freed pages are handed out again
        torch.cuda.current_stream().synchronize()  # expect: FC101
        budget = self.cfg.max_num_tokens
        reqs, qo_lens, tokens = [], [], []
        for req in self.running[: self.max_batch]:
            self._grow(req, 1)
            reqs.append(req)
            qo_lens.append(1)
            tokens.append(req.output[-1] if req.output else req.prompt[-1])
        num_decode = len(reqs)
        budget -= num_decode
        tail_req: Optional[Request] = None
        while self.waiting and budget > 0 and len(reqs) < self.max_batch:
            req = self.waiting[0]
            remaining = len(req.prompt) - req.num_computed
            take = min(remaining, budget, self.chunk_size)
            if take < remaining and tail_req is None and remaining > 2 * self.chunk_size:
                tail_req = req
            self._grow(req, take)
            reqs.append(req)
            qo_lens.append(take)
            tokens.extend(req.prompt[req.num_computed : req.num_computed + take])
            budget -= take
            if take == remaining:
                self.running.append(self.waiting.popleft())
            else:
                break
        kv_lens = [r.kv_len + q for r, q in zip(reqs, qo_lens)]
        total_kv = sum(kv_lens)  # ok: FC101
        if total_kv > self.cfg.num_pages * self.page_size:
            raise RuntimeError(f"scheduled {total_kv} KV tokens, pool holds {self.cfg.num_pages * self.page_size}")
        info = build_batch_info(qo_lens, kv_lens, [r.pages for r in reqs], num_decode, self.page_size, self.device)
        lens_seen = info.kv_lens_cpu[: info.num_reqs].tolist()  # ok: FC101
        for r, q in zip(reqs, qo_lens):
            r.num_computed += q
        tail = None
        if tail_req is not None:
            tail = build_batch_info([1], [lens_seen[-1]], [tail_req.pages], 0, self.page_size, self.device)
        input_ids = torch.tensor(tokens, dtype=torch.long).pin_memory().to(self.device, non_blocking=True)
        scratch = StepScratch(len(tokens), len(reqs), self.device)
        step = ScheduledStep(reqs, info, input_ids, scratch, tail, aborted=bool(self.aborts))
        self.aborts.clear()
        return step
