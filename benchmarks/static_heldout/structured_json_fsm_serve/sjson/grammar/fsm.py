"""JSON schema -> token-level automaton, compiled once per schema on the host.

The schema is expanded into a sequence of pieces (literal keys and punctuation, typed value slots); each piece becomes a
state whose allowed tokens are packed into a 32-bit-word bitmask. Literal pieces admit exactly one tokenization, which
jump-forward decoding appends without running the model.
"""
import json
from dataclasses import dataclass, field
from typing import Dict, List, Sequence

import numpy as np

MASK_WORD_BITS = 32
REJECT = -1

_VALUE_CHARS = {
    "string": set('abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _-.,"'),
    "number": set("0123456789.-eE"),
    "integer": set("0123456789-"),
    "boolean": set("truefals"),
    "null": set("nul"),
}


@dataclass
class CompiledGrammar:
    key: str
    num_states: int
    transitions: np.ndarray            # [num_states, vocab] int32, REJECT where the token is not allowed
    accepting: np.ndarray              # [num_states] bool
    packed_masks: np.ndarray           # [num_states, mask_words] int32, bit set = allowed
    forced: Dict[int, List[int]] = field(default_factory=dict)   # state -> the only tokenization of its literal


def mask_words_for(vocab_size: int) -> int:
    assert MASK_WORD_BITS == 32, "the device unpacking assumes 32-bit mask words"  # ok: FC109
    return (vocab_size + MASK_WORD_BITS - 1) // MASK_WORD_BITS


class SchemaCompiler:
    """Expands a JSON schema into pieces and lifts them onto the tokenizer's vocabulary."""

    def __init__(self, vocab: Sequence[str], max_depth: int):
        self.vocab = list(vocab)
        self.max_depth = max_depth
        self._cache: Dict[str, CompiledGrammar] = {}
        self._by_first_char: Dict[str, List[int]] = {}
        for tok_id, text in enumerate(self.vocab):
            if text:
                self._by_first_char.setdefault(text[0], []).append(tok_id)

    def compile(self, schema: dict) -> CompiledGrammar:
        assert schema.get("type") in ("object", "array"), "top-level schema must be an object or an array"  # expect: FC109
        key = json.dumps(schema, sort_keys=True)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        pieces = self._expand(schema, depth=0)
        grammar = self._lift(key, pieces)
        self._cache[key] = grammar
        return grammar

    def _expand(self, node: dict, depth: int) -> List[str]:
        if depth > self.max_depth:
            raise ValueError(f"schema nesting exceeds {self.max_depth} levels")
        kind = node.get("type", "object")
        if kind == "object":
            props = node.get("properties", {})
            out = ["{"]
            for i, (name, sub) in enumerate(props.items()):
                out.append(json.dumps(name) + ":")
                out.extend(self._expand(sub, depth + 1))
                if i + 1 < len(props):
                    out.append(",")
            out.append("}")
            return out
        if kind == "array":
            return ["["] + self._expand(node.get("items", {"type": "string"}), depth + 1) + ["]"]
        if kind in _VALUE_CHARS:
            return [f"<{kind}>"]
        raise ValueError(f"unsupported schema type {kind!r}")

    def _lift(self, key: str, pieces: List[str]) -> CompiledGrammar:
        vocab_size = len(self.vocab)
        num_states = len(pieces) + 1
        words = mask_words_for(vocab_size)
        transitions = np.full((num_states, vocab_size), REJECT, dtype=np.int32)
        packed = np.zeros((num_states, words), dtype=np.uint32)
        forced: Dict[int, List[int]] = {}
        for state, piece in enumerate(pieces):
            allowed = self._allowed_tokens(piece)
            transitions[state, allowed] = state + 1
            for tok in allowed:
                packed[state, tok // MASK_WORD_BITS] |= np.uint32(1 << (tok % MASK_WORD_BITS))
            if not piece.startswith("<"):
                forced[state] = self._greedy_tokenize(piece)
        accepting = np.zeros(num_states, dtype=bool)
        accepting[-1] = True
        return CompiledGrammar(key, num_states, transitions, accepting, packed.view(np.int32), forced)

    def _allowed_tokens(self, piece: str) -> np.ndarray:
        if piece.startswith("<"):
            chars = _VALUE_CHARS[piece[1:-1]]
            ids = [t for t, text in enumerate(self.vocab) if text and set(text) <= chars]
        else:
            ids = [t for t in self._by_first_char.get(piece[0], []) if piece.startswith(self.vocab[t])]
        return np.asarray(ids, dtype=np.int64)

    def _greedy_tokenize(self, text: str) -> List[int]:
        out: List[int] = []
        pos = 0
        while pos < len(text):
            best, best_len = -1, 0
            for tok in self._by_first_char.get(text[pos], []):
                piece = self.vocab[tok]
                if len(piece) > best_len and text.startswith(piece, pos):
                    best, best_len = tok, len(piece)
            if best < 0:
                raise ValueError(f"literal {text!r} cannot be tokenized at {pos}")
            out.append(best)
            pos += best_len
        return out


class GrammarMatcher:
    """Per-request cursor into a compiled grammar; advanced with host token ids."""

    def __init__(self, grammar: CompiledGrammar):
        self.grammar = grammar
        self.state = 0
        self.terminated = False

    def advance(self, token_id: int) -> bool:
        nxt = int(self.grammar.transitions[self.state, token_id])
        if nxt == REJECT:
            return False
        self.state = nxt
        self.terminated = bool(self.grammar.accepting[nxt])
        return True

    def fill_bitmask(self, out_np: np.ndarray, row: int) -> None:
        out_np[row, :] = self.grammar.packed_masks[self.state]

    def forced_run(self) -> List[int]:
        if self.terminated:
            return []
        return list(self.grammar.forced.get(self.state, ()))
