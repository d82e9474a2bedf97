from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class GenRequest:
    rid: str
    prompt_ids: List[int]
    max_new_tokens: int
    stop: List[str] = field(default_factory=list)
    output_ids: List[int] = field(default_factory=list)
    row: int = -1
    num_cached: int = 0
    finished: bool = False
    finish_reason: Optional[str] = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


class StopChecker:
    """Stop strings per request, checked on the detokenized text as it streams."""

    def __init__(self, max_stop_len=64):
        self.max_stop_len = max_stop_len
        self.stops = {}

    def add(self, rid, stop_strings):
        self._validate(stop_strings)
        self.stops[rid] = list(stop_strings)
        for s in stop_strings:
            self.max_stop_len = max(self.max_stop_len, len(s))

    def _validate(self, stop_strings):
        assert all(isinstance(s, str) and s for s in stop_strings)  # expect: FC109

    def check(self, rid, text_before, delta):
        """Offset in the full text where a stop string starts, or -1."""
        tail = text_before[-self.max_stop_len :] + delta
        base = len(text_before) - len(text_before[-self.max_stop_len :])
        for s in self.stops.get(rid, ()):
            pos = tail.find(s)
            if pos >= 0:
                return base + pos
        return -1

    def drop(self, rid):
        self.stops.pop(rid, None)
