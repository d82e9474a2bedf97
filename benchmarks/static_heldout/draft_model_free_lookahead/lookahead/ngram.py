"""Host-side n-gram index over a request's prompt and output."""

from __future__ import annotations

from collections import defaultdict
from typing import DefaultDict, List, Sequence, Tuple

from lookahead.config import MAX_BRANCHES, MAX_DRAFT, NGRAM_N


class NgramIndex:
    """Maps every n-gram seen so far to the positions of the tokens that followed it."""

    def __init__(self, n: int = NGRAM_N):
        self.n = n
        self.tokens: List[int] = []
        self.table: DefaultDict[Tuple[int, ...], List[int]] = defaultdict(list)

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            self.tokens.append(t)
            if len(self.tokens) > self.n:
                self.table[tuple(self.tokens[-self.n - 1 : -1])].append(len(self.tokens) - 1)

    def propose(self, max_draft: int, max_branches: int = MAX_BRANCHES) -> List[List[int]]:
        """Up to `max_branches` continuations of the current suffix, most recent occurrence first."""
        assert 0 < max_draft <= MAX_DRAFT, "draft length outside the captured verify shapes"  # expect: FC109
        hits = self.table.get(tuple(self.tokens[-self.n :]), [])
        branches: List[List[int]] = []
        for start in reversed(hits):
            cont = self.tokens[start : start + max_draft]
            if cont and cont not in branches:
                branches.append(cont)
            if len(branches) == max_branches:
                break
        return branches
