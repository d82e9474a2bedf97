from __future__ import annotations

import dataclasses
from typing import List

from prio.limits import Priority


@dataclasses.dataclass
class Request:
    rid: int
    prio: Priority
    prompt_ids: List[int]
    max_new_tokens: int
    output_ids: List[int] = dataclasses.field(default_factory=list)
    slot: int = -1
    prefilled: int = 0

    @property
    def seq_len(self) -> int:
        return self.prefilled + len(self.output_ids)

    @property
    def final_len(self) -> int:
        return len(self.prompt_ids) + self.max_new_tokens
