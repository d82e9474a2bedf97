"""Agent requests and their tool calls."""
from __future__ import annotations

import dataclasses
import enum
import time
from typing import Any, Dict, List, Optional


class ReqState(enum.Enum):
    RUNNING = "running"
    AWAITING_TOOL = "awaiting_tool"
    RESUMING = "resuming"
    FINISHED = "finished"


@dataclasses.dataclass
class ToolCall:
    call_id: str
    name: str
    arguments: Dict[str, Any]
    started_at: float = dataclasses.field(default_factory=time.monotonic)


@dataclasses.dataclass
class AgentRequest:
    rid: str
    prompt_ids: List[int]
    page_size: int = 16
    output_ids: List[int] = dataclasses.field(default_factory=list)
    pages: List[int] = dataclasses.field(default_factory=list)
    state: ReqState = ReqState.RUNNING
    pending_tool: Optional[ToolCall] = None
    tool_output_ids: List[int] = dataclasses.field(default_factory=list)
    parked_at: float = 0.0
    on_host: bool = False
    row: int = -1

    @property
    def seq_len(self) -> int:
        # tool output is moved into output_ids once it has been prefilled
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def last_page_len(self) -> int:
        return (self.seq_len - 1) % self.page_size + 1

    @property
    def last_token(self) -> int:
        return (self.output_ids or self.prompt_ids)[-1]

    @classmethod
    def dummy(cls, i: int, page_size: int) -> "AgentRequest":
        return cls(rid=f"__graph{i}", prompt_ids=[0], page_size=page_size, pages=[i])
