"""Token-budget scheduler: decodes first, prefill chunks piggybacked on the rest."""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Deque, List

from sarathi.config import SchedulerConfig
from sarathi.sequence import ChunkSlice, Sequence, SeqStatus


@dataclass
class ScheduledStep:
    decode_seqs: List[Sequence] = field(default_factory=list)
    chunks: List[ChunkSlice] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not self.decode_seqs and not self.chunks

    @property
    def num_tokens(self) -> int:
        return len(self.decode_seqs) + sum(c.length for c in self.chunks)


class PagePool:
    def __init__(self, num_pages: int, page_size: int):
        self.page_size = page_size
        self.free: Deque[int] = collections.deque(range(num_pages))

    def ensure(self, seq: Sequence, upto_tokens: int) -> bool:
        need = (upto_tokens + self.page_size - 1) // self.page_size - len(seq.page_ids)
        if need > len(self.free):
            return False
        for _ in range(max(0, need)):
            seq.page_ids.append(self.free.popleft())
        return True

    def release(self, seq: Sequence) -> None:
        self.free.extend(seq.page_ids)


class TokenBudgetScheduler:
    def __init__(self, cfg: SchedulerConfig, token_budget: int, chunk_size: int):
        assert chunk_size <= token_budget, "a chunk must fit in one step"  # expect: FC109
        self.cfg = cfg
        self.token_budget = token_budget
        self.chunk_size = chunk_size
        self.pages = PagePool(cfg.num_pages, cfg.page_size)
        self.waiting: Deque[Sequence] = collections.deque()
        self.prefilling: List[Sequence] = []
        self.decoding: List[Sequence] = []

    def add_request(self, seq: Sequence) -> None:
        if len(seq.prompt_ids) + seq.max_new_tokens > self.cfg.max_model_len:
            raise ValueError(
                f"request {seq.seq_id}: {len(seq.prompt_ids)} prompt + {seq.max_new_tokens} new tokens "
                f"exceed max_model_len={self.cfg.max_model_len}"
            )
        self.waiting.append(seq)

    def _take_chunk(self, seq: Sequence, budget: int) -> ChunkSlice:
        assert budget > 0  # ok: FC109
        length = min(self.chunk_size, budget, seq.remaining_prefill)
        return ChunkSlice(seq=seq, start=seq.num_computed_tokens, length=length)

    def schedule(self) -> ScheduledStep:
        step = ScheduledStep()
        budget = self.token_budget
        # 1) every running decode gets its token; they are never preempted by prefill
        for seq in self.decoding:
            if len(step.decode_seqs) >= self.cfg.max_num_seqs or budget == 0:
                break
            if not self.pages.ensure(seq, seq.total_len + 1):
                continue
            step.decode_seqs.append(seq)
            budget -= 1
        # 2) piggyback: continue partially prefilled prompts, then admit new ones
        slots = self.cfg.max_num_seqs - len(step.decode_seqs)
        for seq in list(self.prefilling):
            if budget == 0 or slots == 0:
                break
            chunk = self._take_chunk(seq, budget)
            if not self.pages.ensure(seq, chunk.start + chunk.length):
                break
            step.chunks.append(chunk)
            budget -= chunk.length
            slots -= 1
        while self.waiting and budget > 0 and slots > 0:
            seq = self.waiting[0]
            chunk = self._take_chunk(seq, budget)
            if not self.pages.ensure(seq, chunk.length):
                break
            self.waiting.popleft()
            seq.status = SeqStatus.PREFILLING
            self.prefilling.append(seq)
            step.chunks.append(chunk)
            budget -= chunk.length
            slots -= 1
        return step

    def commit(self, step: ScheduledStep, sampled: List[int], eos_id: int) -> List[Sequence]:
        finished: List[Sequence] = []
        nd = len(step.decode_seqs)
        for row, seq in enumerate(step.decode_seqs):
            seq.append_token(sampled[row], eos_id)
        for i, chunk in enumerate(step.chunks):
            chunk.seq.num_computed_tokens += chunk.length
            if chunk.completes_prompt:
                # the row of a prompt-completing chunk carries its first output token
                chunk.seq.status = SeqStatus.DECODING
                chunk.seq.output_ids.append(sampled[nd + i])
                self.prefilling.remove(chunk.seq)
                self.decoding.append(chunk.seq)
        for seq in list(self.decoding):
            if seq.status is SeqStatus.FINISHED:
                self.decoding.remove(seq)
                self.pages.release(seq)
                finished.append(seq)
        return finished
