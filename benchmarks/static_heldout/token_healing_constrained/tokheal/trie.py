"""Prefix trie over the vocabulary's byte strings."""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np


class _Node:
    __slots__ = ("children", "token_ids")

    def __init__(self) -> None:
        self.children: Dict[int, "_Node"] = {}
        self.token_ids: List[int] = []


class PrefixTrie:
    def __init__(self) -> None:
        self.root = _Node()
        self.size = 0

    @classmethod
    def from_vocab(cls, vocab: Iterable[Tuple[int, bytes]]) -> "PrefixTrie":
        trie = cls()
        for tid, text in vocab:
            if text:
                trie.add_token(tid, text)
        return trie

    def add_token(self, token_id: int, text: bytes) -> None:
        self._insert(token_id, text)

    def _insert(self, token_id: int, text: bytes) -> None:
        assert token_id >= 0 and len(text) > 0, "empty or negative token"  # expect: FC109
        node = self.root
        for byte in text:
            node = node.children.setdefault(byte, _Node())
        node.token_ids.append(token_id)
        self.size += 1

    def _find(self, prefix: bytes) -> Optional[_Node]:
        node = self.root
        for byte in prefix:
            node = node.children.get(byte)
            if node is None:
                return None
        return node

    def allowed_ids(self, prefix: bytes) -> np.ndarray:
        """Token ids whose text starts with ``prefix`` (numpy, sorted)."""
        node = self._find(prefix)
        if node is None:
            return np.zeros(0, dtype=np.int64)
        out: List[int] = []
        stack = [node]
        while stack:
            cur = stack.pop()
            out.extend(cur.token_ids)
            stack.extend(cur.children.values())
        return np.unique(np.asarray(out, dtype=np.int64))
