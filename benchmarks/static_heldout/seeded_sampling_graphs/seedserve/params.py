from __future__ import annotations

import dataclasses
from typing import List, Optional


@dataclasses.dataclass
class SamplingParams:
    temperature: float = 1.0
    seed: Optional[int] = None
    logprobs: int = 0
    max_new_tokens: int = 256
    eos_token_id: Optional[int] = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclasses.dataclass
class Request:
    rid: int
    prompt_ids: List[int]
    params: SamplingParams
    slot: int = -1
    # siblings of an n>1 request share `group` and their prompt pages
    group: int = -1
    num_generated: int = 0
    pages: List[int] = dataclasses.field(default_factory=list)
    output_ids: List[int] = dataclasses.field(default_factory=list)
    output_logprobs: List[List[float]] = dataclasses.field(default_factory=list)
    philox_offset: int = 0
    finished: bool = False

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + self.num_generated

    @property
    def done_by_length(self) -> bool:
        return self.num_generated >= self.params.max_new_tokens
