"""One streaming request: text from the detokenizer in, OpenAI-style chunks out."""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from toolstream import StreamingToolParser, ToolCallDelta


@dataclass
class ToolStreamSession:
    rid: str
    row: int
    parser: StreamingToolParser = field(default_factory=StreamingToolParser)
    queue: "asyncio.Queue[Optional[str]]" = field(default_factory=asyncio.Queue)
    num_calls: int = 0

    def _chunk(self, d: ToolCallDelta) -> Dict[str, Any]:
        if d.content:
            return {"id": self.rid, "choices": [{"delta": {"content": d.content}}]}
        call: Dict[str, Any] = {"index": d.index}
        if d.name is not None:
            call.update(type="function", function={"name": d.name, "arguments": ""})
            self.num_calls = max(self.num_calls, d.index + 1)
        else:
            call["function"] = {"arguments": d.arguments_delta}
        return {"id": self.rid, "choices": [{"delta": {"tool_calls": [call]}}]}

    def on_text(self, text: str) -> List[str]:
        return [f"data: {json.dumps(self._chunk(d))}\n\n" for d in self.parser.feed(text)]

    def finish_reason(self) -> str:
        return "tool_calls" if self.num_calls else "stop"
