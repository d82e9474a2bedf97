from __future__ import annotations

import collections
from typing import Deque, Dict, List, Tuple

import torch


class OutputProcessor:
    """Hands sampled tokens to the API side; runs on the output thread, off the step."""

    def __init__(self, max_bs: int):
        self.tokens_cpu = [torch.zeros(max_bs, dtype=torch.int64, pin_memory=True) for _ in range(2)]
        self.pending: Deque[Tuple[List[str], int, int, torch.cuda.Event]] = collections.deque()

    def push(self, request_ids: List[str], bs: int, buf: int, event: torch.cuda.Event) -> None:
        self.pending.append((list(request_ids), bs, buf, event))

    def drain(self) -> Dict[str, int]:
        out: Dict[str, int] = {}
        while self.pending:
            ids, bs, buf, event = self.pending.popleft()
            event.synchronize()
            out.update(zip(ids, self.tokens_cpu[buf][:bs].tolist()))  # ok: FC101
        return out
