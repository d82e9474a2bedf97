from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Optional


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH = 4
    FINISHED_ABORTED = 5

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED


@dataclass
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0
    stop_token_ids: tuple[int, ...] = ()


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    # tokens whose KV is in the cache (prefix hits included); reset to the
    # cached prefix on preemption by recompute
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1
    num_preemptions: int = 0
    block_hashes: list[int] = field(default_factory=list)
    arrival_time: float = field(default_factory=time.monotonic)
    stop_reason: Optional[str] = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def append_output_token_ids(self, token_ids: list[int]) -> None:
        self.output_token_ids.extend(token_ids)

    def check_stop(self, max_model_len: int) -> bool:
        if self.num_tokens >= max_model_len or len(self.output_token_ids) >= self.sampling_params.max_tokens:
            self.status = RequestStatus.FINISHED_LENGTH
            return True
        if self.output_token_ids and self.output_token_ids[-1] in self.sampling_params.stop_token_ids:
            self.status = RequestStatus.FINISHED_STOPPED
            self.stop_reason = "stop_token"
            return True
        return False
