"""Finds the rows whose sampled token closes a tool call."""
from __future__ import annotations

from typing import List

import torch

from agentsrv.settings import AgentSettings


class ToolCallDetector:
    def __init__(self, settings: AgentSettings):
        self.start_id = settings.tool_call_start_id
        self.end_id = settings.tool_call_end_id

    def scan(self, tokens: torch.Tensor) -> List[int]:
        return torch.nonzero(tokens == self.end_id).flatten().tolist()  # expect: FC101
