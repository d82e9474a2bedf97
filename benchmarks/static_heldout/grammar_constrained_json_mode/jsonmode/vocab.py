"""Classes of tokens the JSON grammar tells apart."""
from __future__ import annotations

import enum
from typing import Sequence

import numpy as np


class TokenClass(enum.IntEnum):
    OTHER = 0
    LBRACE = 1
    RBRACE = 2
    LBRACKET = 3
    RBRACKET = 4
    COLON = 5
    COMMA = 6
    QUOTE = 7
    STRING_CHAR = 8
    DIGIT = 9
    LITERAL = 10  # true / false / null
    WHITESPACE = 11
    EOS = 12


_SINGLE = {"{": TokenClass.LBRACE, "}": TokenClass.RBRACE, "[": TokenClass.LBRACKET, "]": TokenClass.RBRACKET,
           ":": TokenClass.COLON, ",": TokenClass.COMMA, '"': TokenClass.QUOTE}


def classify(text: str) -> TokenClass:
    s = text.strip()
    if not s:
        return TokenClass.WHITESPACE if text else TokenClass.OTHER
    if s in _SINGLE:
        return _SINGLE[s]
    if s.lstrip("-").replace(".", "", 1).isdigit():
        return TokenClass.DIGIT
    if s in ("true", "false", "null"):
        return TokenClass.LITERAL
    if '"' not in s and "\\" not in s:
        return TokenClass.STRING_CHAR
    return TokenClass.OTHER


class TokenClassTable:
    def __init__(self, vocab: Sequence[str], eos_id: int, padded_size: int) -> None:
        self.classes = np.full(padded_size, int(TokenClass.OTHER), dtype=np.int8)
        for tid, text in enumerate(vocab):
            self.classes[tid] = int(classify(text))
        self.classes[eos_id] = int(TokenClass.EOS)

    def words_for(self, allowed: Sequence[TokenClass]) -> np.ndarray:
        bits = np.isin(self.classes, np.asarray([int(c) for c in allowed], dtype=np.int8))
        packed = np.packbits(bits.reshape(-1, 32)[:, ::-1], axis=1, bitorder="big")
        return packed.view(">u4").astype(np.uint32).view(np.int32).reshape(-1)
