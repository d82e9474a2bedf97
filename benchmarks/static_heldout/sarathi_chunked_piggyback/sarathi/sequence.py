"""Request state kept on the host."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import List


class SeqStatus(enum.Enum):
    WAITING = 0
    PREFILLING = 1
    DECODING = 2
    FINISHED = 3


@dataclass
class Sequence:
    seq_id: int
    prompt_ids: List[int]
    max_new_tokens: int = 256
    temperature: float = 1.0
    output_ids: List[int] = field(default_factory=list)
    page_ids: List[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: SeqStatus = SeqStatus.WAITING

    @property
    def total_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def remaining_prefill(self) -> int:
        return max(0, len(self.prompt_ids) - self.num_computed_tokens)

    def token_at(self, pos: int) -> int:
        if pos < len(self.prompt_ids):
            return self.prompt_ids[pos]
        return self.output_ids[pos - len(self.prompt_ids)]

    def append_token(self, tok: int, eos_id: int) -> None:
        self.output_ids.append(tok)
        self.num_computed_tokens += 1
        if tok == eos_id or len(self.output_ids) >= self.max_new_tokens:
            self.status = SeqStatus.FINISHED


@dataclass
class ChunkSlice:
    """A slice ``[start, start + length)`` of one prompt, prefetched this step."""

    seq: Sequence
    start: int
    length: int

    @property
    def completes_prompt(self) -> bool:
        return self.start + self.length >= len(self.seq.prompt_ids)
