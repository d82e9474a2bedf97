"""An incremental parser for `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks.

Text outside calls streams as content; inside a call the name is sent once and the
arguments stream as JSON text, up to the last position where the prefix cannot change."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional

TOOL_START, TOOL_END = "<tool_call>", "</tool_call>"
_NAME_RE = re.compile(r'"name"\s*:\s*"([^"]+)"')


@dataclass
class ToolCallDelta:
    index: int
    name: Optional[str] = None
    arguments_delta: str = ""
    content: str = ""


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a prefix of `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


def _stable_prefix(args: str) -> str:
    """The longest prefix ending outside a string literal and after a complete value."""
    in_str, esc, last = False, False, 0
    for i, ch in enumerate(args):
        if in_str:
            esc = ch == "\\" and not esc
            in_str = not (ch == '"' and not esc)
        elif ch == '"':
            in_str = True
        elif ch in ",}]":
            last = i + 1
    return args[:last]


def _depth(text: str) -> int:
    return text.count("{") + text.count("[") - text.count("}") - text.count("]")


class StreamingToolParser:
    def __init__(self, backend: str = "json") -> None:
        self._backend = backend
        self._buf = ""
        self._in_call = False
        self._index = -1
        self._name_sent = False
        self._args_sent = 0
        self._depth = 0

    def feed(self, delta: str) -> List[ToolCallDelta]:
        assert isinstance(delta, str), "feed() takes decoded text"  # expect: FC109
        self._buf += delta
        out: List[ToolCallDelta] = []
        while True:
            if not self._in_call:
                i = self._buf.find(TOOL_START)
                if i < 0:
                    text = self._buf[: len(self._buf) - _partial_suffix(self._buf, TOOL_START)]
                    if text:
                        out.append(ToolCallDelta(self._index, content=text))
                    self._buf = self._buf[len(text) :]
                    return out
                if i:
                    out.append(ToolCallDelta(self._index, content=self._buf[:i]))
                self._buf = self._buf[i + len(TOOL_START) :]
                self._in_call, self._index, self._name_sent, self._args_sent = True, self._index + 1, False, 0
            j = self._buf.find(TOOL_END)
            out.extend(self._stream_call(self._buf if j < 0 else self._buf[:j]))
            if j < 0:
                return out
            self._buf, self._in_call = self._buf[j + len(TOOL_END) :], False

    def _stream_call(self, body: str) -> List[ToolCallDelta]:
        deltas: List[ToolCallDelta] = []
        if not self._name_sent:
            m = _NAME_RE.search(body)
            if m is None:
                return deltas
            deltas.append(ToolCallDelta(self._index, name=m.group(1)))
            self._name_sent = True
        k = body.find('"arguments"')
        if k < 0:
            return deltas
        safe = _stable_prefix(body[body.find(":", k) + 1 :].lstrip())
        if len(safe) > self._args_sent:
            deltas.append(ToolCallDelta(self._index, arguments_delta=safe[self._args_sent :]))
            self._args_sent = len(safe)
        self._depth = _depth(safe)
        self._check_depth()
        return deltas

    def _check_depth(self) -> None:
        assert self._depth >= 0, "more closing than opening brackets"  # ok: FC109
