from collections import deque
from dataclasses import dataclass, field
from typing import Deque, List, Optional

import numpy as np


@dataclass
class EvalRequest:
    req_id: int
    prompt: List[int]
    seed: int
    max_new_tokens: int
    slot: int = -1
    pages: List[int] = field(default_factory=list)
    output: List[int] = field(default_factory=list)
    prefilled: bool = False

    @property
    def seq_len(self) -> int:
        return len(self.prompt) + len(self.output)


@dataclass
class EvalBatch:
    reqs: List[EvalRequest]
    qo_lens: np.ndarray
    kv_lens: np.ndarray
    input_ids_np: np.ndarray
    positions_np: np.ndarray

    @property
    def size(self) -> int:
        return len(self.reqs)

    @property
    def has_prefill(self) -> bool:
        return bool((self.qo_lens > 1).any())  # ok: FC101


class EvalScheduler:
    def __init__(self, max_batch: int, page_size: int, num_pages: int):
        self.max_batch = max_batch
        self.page_size = page_size
        self.free_pages = list(range(num_pages - 1, -1, -1))
        self.waiting: Deque[EvalRequest] = deque()
        self.running: List[EvalRequest] = []

    def add(self, req: EvalRequest) -> None:
        self.waiting.append(req)

    def next_batch(self) -> Optional[EvalBatch]:
        while self.waiting and len(self.running) < self.max_batch:
            self.running.append(self.waiting.popleft())
        self.running = [r for r in self.running if len(r.output) < r.max_new_tokens]
        if not self.running:
            return None
        qo, ids, pos = [], [], []
        for r in self.running:
            need = (r.seq_len + self.page_size - 1) // self.page_size - len(r.pages)
            r.pages.extend(self.free_pages.pop() for _ in range(need))
            new = r.prompt if not r.prefilled else r.output[-1:]
            qo.append(len(new))
            ids.extend(new)
            pos.extend(range(r.seq_len - len(new), r.seq_len))
            r.prefilled = True
        return EvalBatch(list(self.running), np.asarray(qo, np.int32), np.asarray([r.seq_len for r in self.running], np.int32),
                         np.asarray(ids, np.int64), np.asarray(pos, np.int64))
