"""Suffix tries over token ids, walked on the host between steps.

One trie per live request (its prompt and what it generated so far) and one global
trie over past responses.  A draft is the most frequent continuation of the longest
suffix of the current context that the trie has seen.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple


@dataclass
class SuffixNode:
    token: int = -1
    depth: int = 0
    count: int = 0
    children: Dict[int, "SuffixNode"] = field(default_factory=dict)

    def best_child(self) -> Optional["SuffixNode"]:
        if not self.children:
            return None
        return max(self.children.values(), key=lambda n: n.count)


class SuffixTree:
    """A depth-bounded suffix trie (host memory only)."""

    def __init__(self, max_depth: int, capacity: int = 1 << 21):
        self._root = SuffixNode()
        self._max_depth = max_depth
        self._capacity = capacity
        self._num_nodes = 1

    @property
    def num_nodes(self) -> int:
        return self._num_nodes

    def extend(self, tokens: List[int], new_from: int = 0) -> None:
        """Insert the suffixes that end in tokens[new_from:]."""
        start = max(0, new_from - self._max_depth + 1)
        for end in range(max(new_from, 1), len(tokens) + 1):
            self._insert_window(tokens, max(start, end - self._max_depth), end)

    def _insert_window(self, tokens: List[int], lo: int, hi: int) -> None:
        node = self._root
        for tok in tokens[lo:hi]:
            nxt = node.children.get(tok)
            if nxt is None:
                assert self._num_nodes < self._capacity  # ok: FC109
                nxt = SuffixNode(token=tok, depth=node.depth + 1)
                node.children[tok] = nxt
                self._num_nodes += 1
            nxt.count += 1
            node = nxt

    def speculate(self, context: List[int], budget: int, min_prob: float) -> Tuple[List[int], List[float]]:
        node, matched = self._longest_match(context)
        if node is None or matched == 0:
            return [], []
        tokens: List[int] = []
        probs: List[float] = []
        prob = 1.0
        while len(tokens) < budget:
            child = node.best_child()
            if child is None:
                break
            prob *= child.count / max(1, sum(c.count for c in node.children.values()))
            if prob < min_prob:
                break
            tokens.append(child.token)
            probs.append(prob)
            node = child
        return tokens, probs

    def _longest_match(self, context: List[int]) -> Tuple[Optional[SuffixNode], int]:
        best: Optional[SuffixNode] = None
        best_len = 0
        for start in range(max(0, len(context) - self._max_depth), len(context)):
            node, n = self._descend(self._root, context, start)
            if n == len(context) - start and n > best_len:
                best, best_len = node, n
                break
        return best, best_len

    def _descend(self, node: SuffixNode, context: List[int], start: int) -> Tuple[SuffixNode, int]:
        assert node.depth == 0  # ok: FC109
        n = 0
        for tok in context[start:]:
            nxt = node.children.get(tok)
            if nxt is None:
                break
            node = nxt
            n += 1
        return node, n

    def prune(self, min_count: int) -> int:
        removed = 0
        stack = [self._root]
        while stack:
            node = stack.pop()
            for tok in [t for t, c in node.children.items() if c.count < min_count]:
                del node.children[tok]
                removed += 1
            stack.extend(node.children.values())
        self._num_nodes -= removed
        return removed
