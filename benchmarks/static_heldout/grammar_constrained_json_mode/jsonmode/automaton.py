"""A host automaton per request over token classes, with precomputed allowed-token masks."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Dict, List, Sequence

import numpy as np
import torch

from .vocab import TokenClass, TokenClassTable

TC = TokenClass


class JsonState(enum.IntEnum):
    VALUE = 0
    KEY_OR_END = 1
    KEY = 2
    COLON = 3
    AFTER_VALUE = 4
    STRING = 5
    NUMBER = 6
    DONE = 7


_ALLOWED: Dict[JsonState, Sequence[TokenClass]] = {
    JsonState.VALUE: (TC.LBRACE, TC.LBRACKET, TC.QUOTE, TC.DIGIT, TC.LITERAL, TC.WHITESPACE),
    JsonState.KEY_OR_END: (TC.QUOTE, TC.RBRACE, TC.WHITESPACE),
    JsonState.KEY: (TC.STRING_CHAR, TC.QUOTE),
    JsonState.COLON: (TC.COLON, TC.WHITESPACE),
    JsonState.AFTER_VALUE: (TC.COMMA, TC.RBRACE, TC.RBRACKET, TC.WHITESPACE, TC.EOS),
    JsonState.STRING: (TC.STRING_CHAR, TC.QUOTE),
    JsonState.NUMBER: (TC.DIGIT, TC.COMMA, TC.RBRACE, TC.RBRACKET, TC.WHITESPACE),
    JsonState.DONE: (TC.EOS,),
}


@dataclass
class RequestGrammar:
    state: JsonState = JsonState.VALUE
    stack: List[str] = field(default_factory=list)
    forced: List[int] = field(default_factory=list)


class JsonAutomaton:
    def __init__(self, table: TokenClassTable, colon_token: int) -> None:
        self.table = table
        self.colon_token = colon_token
        self.requests: Dict[int, RequestGrammar] = {}
        self.allowed_by_state = np.stack([table.words_for(_ALLOWED[s]) for s in JsonState])
        self._check_table()

    def _check_table(self) -> None:
        assert self.allowed_by_state.shape[0] == len(JsonState), "one mask row per state"  # ok: FC109

    def add_request(self, rid: int) -> None:
        self.requests[rid] = RequestGrammar()

    def allowed_words(self, rid: int) -> np.ndarray:
        return self.allowed_by_state[int(self.requests[rid].state)]

    def forced_tokens(self, rids: Sequence[int]) -> List[List[int]]:
        out = []
        for rid in rids:
            g = self.requests[rid]
            out.append(g.forced)
            g.forced = []
        return out

    def advance(self, rid: int, token_id: int) -> None:
        g = self.requests[rid]
        c = TokenClass(int(self.table.classes[token_id]))
        if c == TC.LBRACE:
            g.stack.append("{")
            g.state = JsonState.KEY_OR_END
        elif c == TC.LBRACKET:
            g.stack.append("[")
            g.state = JsonState.VALUE
        elif c in (TC.RBRACE, TC.RBRACKET):
            g.stack.pop()
            g.state = JsonState.AFTER_VALUE if g.stack else JsonState.DONE
        elif c == TC.QUOTE:
            if g.state == JsonState.KEY_OR_END:
                g.state = JsonState.KEY
            elif g.state == JsonState.KEY:
                g.state = JsonState.VALUE
                g.forced.append(self.colon_token)  # jump forward over the colon
            elif g.state == JsonState.STRING:
                g.state = JsonState.AFTER_VALUE
            else:
                g.state = JsonState.STRING
        elif c == TC.COMMA:
            g.state = JsonState.KEY if g.stack and g.stack[-1] == "{" else JsonState.VALUE
        elif c in (TC.DIGIT, TC.LITERAL) and g.state == JsonState.VALUE:
            g.state = JsonState.NUMBER if c == TC.DIGIT else JsonState.AFTER_VALUE

    def advance_batch(self, rids: Sequence[int], token_ids: torch.Tensor) -> None:
        for rid, tok in zip(rids, [int(t) for t in token_ids]):  # expect: FC101
            self.advance(rid, tok)
