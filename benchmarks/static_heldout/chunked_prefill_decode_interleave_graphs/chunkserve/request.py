from dataclasses import dataclass, field
from typing import List

import numpy as np


@dataclass
class Request:
    request_id: str
    prompt_ids: List[int]
    max_new_tokens: int
    pages: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    num_computed: int = 0
    output_ids: List[int] = field(default_factory=list)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def prefill_done(self) -> bool:
        return self.num_computed >= self.prompt_len

    @property
    def seq_len(self) -> int:
        return self.num_computed + (len(self.output_ids) if self.prefill_done else 0)


@dataclass
class PrefillChunk:
    req: Request
    start: int
    end: int

    @property
    def num_tokens(self) -> int:
        return self.end - self.start

    @property
    def completes_prompt(self) -> bool:
        return self.end == self.req.prompt_len


@dataclass
class StepPlan:
    decodes: List[Request]
    chunks: List[PrefillChunk]

    @property
    def decode_only(self) -> bool:
        return not self.chunks

    @property
    def num_tokens(self) -> int:
        return len(self.decodes) + sum(c.num_tokens for c in self.chunks)
