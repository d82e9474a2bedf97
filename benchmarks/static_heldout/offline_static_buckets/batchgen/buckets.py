"""Static buckets: prompts sorted by length and packed into fixed batch shapes.

An offline job knows every prompt up front, so it sorts them, packs each run of similar lengths
into the largest batch bucket that fits the KV budget and decodes the bucket to completion;
rows that finish early stay in the batch as padding until the bucket drains.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, List, Sequence

import numpy as np


@dataclass(frozen=True)
class BucketSpec:
    batch_size: int
    max_prompt_len: int
    max_new_tokens: int

    @property
    def max_total_len(self) -> int:
        return self.max_prompt_len + self.max_new_tokens

    def pages_per_row(self, page_size: int) -> int:
        return -(-self.max_total_len // page_size)


@dataclass
class PackedBucket:
    spec: BucketSpec
    prompt_ids: List[List[int]]
    row_to_prompt: np.ndarray              # prompt index of every row, -1 for padding rows
    prompt_lens: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))

    @property
    def num_live(self) -> int:
        return int((self.row_to_prompt >= 0).sum())


class BucketTable:
    def __init__(self, batch_sizes: Sequence[int], prompt_lens: Sequence[int], max_new_tokens: int, kv_token_budget: int):
        assert list(batch_sizes) == sorted(batch_sizes), "batch sizes must be ascending"  # expect: FC109
        if max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be positive")
        self.batch_sizes = list(batch_sizes)
        self.prompt_lens = sorted(prompt_lens)
        self.max_new_tokens = max_new_tokens
        self.kv_token_budget = kv_token_budget
        self.specs = [
            BucketSpec(bs, L, max_new_tokens)
            for L in self.prompt_lens
            for bs in self.batch_sizes
            if bs * (L + max_new_tokens) <= kv_token_budget
        ]

    def largest_batch_for(self, prompt_len: int) -> BucketSpec:
        fits = [s for s in self.specs if s.max_prompt_len >= prompt_len]
        if not fits:
            raise ValueError(f"prompt of {prompt_len} tokens exceeds every bucket")
        L = min(s.max_prompt_len for s in fits)
        return max((s for s in fits if s.max_prompt_len == L), key=lambda s: s.batch_size)

    def pack(self, prompts: List[List[int]]) -> Iterator[PackedBucket]:
        lens = np.array([len(p) for p in prompts], dtype=np.int32)
        order = np.argsort(lens, kind="stable")
        i = 0
        while i < len(order):
            spec = self.largest_batch_for(int(lens[order[i]]))
            take = order[i : i + spec.batch_size]
            take = take[lens[take] <= spec.max_prompt_len]
            rows = np.full(spec.batch_size, -1, dtype=np.int64)
            rows[: len(take)] = take
            yield PackedBucket(spec, [prompts[j] for j in take], rows, lens[take])
            i += len(take)
