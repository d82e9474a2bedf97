"""Beam scores: length normalisation and the finished-hypothesis heap of a request."""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Iterator, List, Tuple

import torch


@torch.compile(dynamic=True)
def length_normalize(cum_logprobs: torch.Tensor, lengths: torch.Tensor, alpha: float) -> torch.Tensor:
    return cum_logprobs / lengths.float().pow(alpha)


@dataclass(order=True)
class Hypothesis:
    score: float
    tokens: List[int] = field(compare=False, default_factory=list)


@dataclass
class FinishedHeap:
    width: int
    heap: List[Hypothesis] = field(default_factory=list)

    def push(self, score: float, tokens: List[int]) -> None:
        item = Hypothesis(score, list(tokens))
        if len(self.heap) < self.width:
            heapq.heappush(self.heap, item)
        elif score > self.heap[0].score:
            heapq.heapreplace(self.heap, item)

    def is_done(self, best_alive: float) -> bool:
        return len(self.heap) == self.width and self.heap[0].score >= best_alive

    def __iter__(self) -> Iterator[Hypothesis]:
        return iter(sorted(self.heap, reverse=True))


def split_parent_token(flat_idx: torch.Tensor, vocab: int) -> Tuple[torch.Tensor, torch.Tensor]:
    return flat_idx // vocab, flat_idx % vocab
