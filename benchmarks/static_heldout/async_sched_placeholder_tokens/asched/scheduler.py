"""A scheduler one step ahead of the runner: decode rows whose sampled token is still on the
device get ``PLACEHOLDER_TOKEN_ID`` and their previous row; the runner swaps the ids in on the device."""
import queue
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, List, Optional

import numpy as np
import torch

from .config import PLACEHOLDER_TOKEN_ID, AsyncSchedConfig
from .outputs import SamplerOutput


def pages_for(num_tokens: int, page_size: int) -> int:
    return -(-num_tokens // page_size)


@dataclass
class Request:
    req_id: str
    prompt_token_ids: List[int]
    max_tokens: int
    num_output: int = 0
    page_ids: List[int] = field(default_factory=list)
    prev_slot: int = -1

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.num_output


@dataclass
class SchedulerOutput:
    req_ids: List[str]
    token_ids_cpu: torch.Tensor
    placeholder_mask_cpu: torch.Tensor
    prev_slot_cpu: torch.Tensor
    query_lens_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    page_table: List[List[int]]
    num_prefill_tokens: int
    num_decode: int

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)


class AsyncScheduler:
    def __init__(self, cfg: AsyncSchedConfig, num_pages: int):
        self.cfg = cfg
        self.free_pages: List[int] = list(range(num_pages))
        self.waiting: Deque[Request] = deque()
        self.running: List[Request] = []
        self.num_tokens_np = np.zeros(cfg.max_num_reqs, dtype=np.int64)
        self.reserved_eos_rows = 0
        self.finished_queue: "queue.SimpleQueue[str]" = queue.SimpleQueue()

    def add_request(self, req: Request) -> None:
        assert req.prompt_len > 0 and req.max_tokens > 0, "empty request"  # expect: FC109
        self.waiting.append(req)

    def _alloc(self, n: int) -> List[int]:
        if n > len(self.free_pages):
            raise MemoryError(f"need {n} pages, {len(self.free_pages)} free")
        out, self.free_pages = self.free_pages[:n], self.free_pages[n:]
        return out

    def finish(self, req_id: str) -> None:
        done = [r for r in self.running if r.req_id == req_id]
        self.running = [r for r in self.running if r.req_id != req_id]
        self.free_pages.extend(p for r in done for p in r.page_ids)

    def _check_invariants(self) -> None:
        assert len(self.running) <= self.cfg.max_num_reqs  # ok: FC109

    def _grow_pages(self, req: Request) -> None:
        need = pages_for(req.seq_len, self.cfg.page_size) - len(req.page_ids)
        if need > 0:
            req.page_ids.extend(self._alloc(need))

    def schedule(self, prev_output: Optional[SamplerOutput]) -> SchedulerOutput:
        while not self.finished_queue.empty():
            self.finish(self.finished_queue.get_nowait())
        if prev_output is not None:
            # rows that sampled EOS last step keep their slot until the output thread frees them
            self.reserved_eos_rows = int(prev_output.is_eos.sum())  # expect: FC101
        for req in self.running:
            req.num_output += 1
            self._grow_pages(req)
        num_decode = len(self.running)
        token_ids: List[int] = [PLACEHOLDER_TOKEN_ID] * num_decode
        mask: List[bool] = [True] * num_decode
        prev_slot: List[int] = [r.prev_slot for r in self.running]
        query_lens: List[int] = [1] * num_decode
        budget = self.cfg.max_num_tokens - num_decode
        num_prefill_tokens = 0
        room = self.cfg.max_num_reqs - self.reserved_eos_rows
        while self.waiting and len(self.running) < room:
            req = self.waiting[0]
            if req.prompt_len > budget:
                break
            self.waiting.popleft()
            req.page_ids = self._alloc(pages_for(req.prompt_len, self.cfg.page_size))
            token_ids.extend(req.prompt_token_ids)
            mask.extend([False] * req.prompt_len)
            prev_slot.extend([-1] * req.prompt_len)
            query_lens.append(req.prompt_len)
            num_prefill_tokens += req.prompt_len
            budget -= req.prompt_len
            self.running.append(req)
        for row, req in enumerate(self.running):
            req.prev_slot = row
            self.num_tokens_np[row] = req.seq_len
        total = int(self.num_tokens_np[: len(self.running)].sum())  # ok: FC101
        if total > self.cfg.max_num_reqs * self.cfg.max_model_len:
            raise RuntimeError(f"scheduled {total} tokens of context, over the engine's limit")
        self._check_invariants()
        return SchedulerOutput(
            req_ids=[r.req_id for r in self.running],
            token_ids_cpu=torch.tensor(token_ids, dtype=torch.int64).pin_memory(),
            placeholder_mask_cpu=torch.tensor(mask, dtype=torch.bool).pin_memory(),
            prev_slot_cpu=torch.tensor(prev_slot, dtype=torch.int64).pin_memory(),
            query_lens_cpu=torch.tensor(query_lens, dtype=torch.int32),
            seq_lens_cpu=torch.tensor([r.seq_len for r in self.running], dtype=torch.int32),
            page_table=[list(r.page_ids) for r in self.running],
            num_prefill_tokens=num_prefill_tokens, num_decode=num_decode,
        )
