from __future__ import annotations

import dataclasses
import enum
from typing import List


class Tier(enum.Enum):
    SMALL = "small"
    LARGE = "large"


@dataclasses.dataclass
class Request:
    rid: int
    prompt_ids: List[int]
    output_ids: List[int] = dataclasses.field(default_factory=list)
    tier: Tier = Tier.SMALL
    slot: int = -1
    pages: List[int] = dataclasses.field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)
