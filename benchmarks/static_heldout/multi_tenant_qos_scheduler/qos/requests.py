import enum
from dataclasses import dataclass, field
from typing import List, Optional

import torch


class RequestState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"


@dataclass
class Request:
    request_id: str
    tenant: str
    priority: int
    prompt_len: int
    max_new_tokens: int
    generated: int = 0
    pages: List[int] = field(default_factory=list)
    state: RequestState = RequestState.WAITING
    host_kv: Optional[torch.Tensor] = None   # pinned copy while swapped out
    arrival: float = 0.0

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.generated

    @property
    def is_prefill(self) -> bool:
        return self.generated == 0
