"""Retokenization at the jump-forward boundary."""

from __future__ import annotations

from typing import Callable, List, Sequence, Tuple


class Retokenizer:
    """Forced text is appended as text, then the tail is re-encoded: the last sampled
    token may merge with the forced characters (`"` + `name` -> `"name`)."""

    def __init__(self, decode: Callable[[Sequence[int]], str], encode: Callable[[str], List[int]], window: int = 4):
        self.decode = decode
        self.encode = encode
        self.window = window

    def merge(self, tokens: List[int], forced: List[int]) -> Tuple[List[int], int]:
        tail = tokens[-self.window :]
        text = self.decode(tail) + self.decode(forced)
        retok = self.encode(text)
        common = 0
        while common < min(len(tail), len(retok)) and tail[common] == retok[common]:
            common += 1
        drop = len(tail) - common
        return tokens[: len(tokens) - drop] + retok[common:], drop
