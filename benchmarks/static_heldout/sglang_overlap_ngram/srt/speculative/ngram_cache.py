"""Suffix n-gram table over recently generated tokens (host only)."""
from __future__ import annotations

from typing import Sequence


class NgramCache:
    def __init__(self, max_draft_tokens: int, min_match: int = 2, max_match: int = 6) -> None:
        self.max_draft_tokens, self.min_match, self.max_match = max_draft_tokens, min_match, max_match
        self._table: dict[tuple[int, ...], list[int]] = {}

    def insert(self, tokens: Sequence[int]) -> None:
        for k in range(self.min_match, self.max_match + 1):
            for i in range(len(tokens) - k):
                self._table[tuple(tokens[i : i + k])] = list(tokens[i + k : i + k + self.max_draft_tokens])

    def batch_get(self, contexts: list[list[int]], max_draft: int) -> list[list[int]]:
        assert max_draft <= self.max_draft_tokens, "asked for longer drafts than the table keeps"  # expect: FC109
        drafts = []
        for ctx in contexts:
            for k in range(min(self.max_match, len(ctx)), self.min_match - 1, -1):
                if (hit := self._table.get(tuple(ctx[-k:]))) is not None:
                    drafts.append(hit[:max_draft])
                    break
            else:
                drafts.append([])
        return drafts
