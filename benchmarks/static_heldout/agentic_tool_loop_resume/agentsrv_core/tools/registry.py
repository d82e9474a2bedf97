"""Registered tools, their output budgets, and tool-call parsing."""
from __future__ import annotations

import json
import uuid
from typing import Callable, Dict, List

from agentsrv.requests import ToolCall


class ToolRegistry:
    def __init__(self, start_id: int, end_id: int, detokenize: Callable[[List[int]], str]):
        self.start_id = start_id
        self.end_id = end_id
        self.detokenize = detokenize
        self.handlers: Dict[str, Callable[..., str]] = {}
        self.max_output_tokens: Dict[str, int] = {}

    def register(self, name: str, handler: Callable[..., str], max_output_tokens: int = 4096) -> None:
        assert max_output_tokens > 0, f"tool {name} needs a positive output budget"  # expect: FC109
        self.handlers[name] = handler
        self.max_output_tokens[name] = max_output_tokens

    def parse(self, output_ids: List[int]) -> ToolCall:
        start = len(output_ids) - 1 - output_ids[::-1].index(self.start_id)
        body = json.loads(self.detokenize(output_ids[start + 1 : -1]))
        return ToolCall(call_id=uuid.uuid4().hex, name=body["name"], arguments=body.get("arguments", {}))

    def run(self, call: ToolCall) -> str:
        handler = self.handlers.get(call.name)
        if handler is None:
            return json.dumps({"error": f"unknown tool {call.name}"})
        return handler(**call.arguments)

    def budget(self, name: str) -> int:
        return self.max_output_tokens.get(name, 1024)
