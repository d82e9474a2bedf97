"""Sampled ids of the last step, copied to pinned memory behind an event."""

from typing import List

import torch

from .request import Request


class PendingOutputs:
    def __init__(self, max_rows: int) -> None:
        self.tokens_host = torch.zeros(max_rows, dtype=torch.long, pin_memory=True)
        self.done = torch.cuda.Event()
        self.rows: List[Request] = []
        self.in_flight = False

    def stage(self, next_ids: torch.Tensor, rows: List[Request]) -> None:
        n = len(rows)
        self.tokens_host[:n].copy_(next_ids[:n], non_blocking=True)
        self.done.record()
        self.rows = rows
        self.in_flight = True
