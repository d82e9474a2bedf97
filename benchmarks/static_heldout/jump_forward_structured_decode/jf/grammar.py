"""Token-level FSMs for templates / regexes and the per-request matcher pool."""

from __future__ import annotations

import dataclasses
import functools
from typing import Dict, List, Sequence, Set

import numpy as np
import torch


@dataclasses.dataclass
class TokenFSM:
    """transitions[state] maps an allowed token to the next state."""

    transitions: List[Dict[int, int]]
    accept: Set[int]
    vocab_size: int

    @property
    def num_states(self) -> int:
        return len(self.transitions)

    @functools.lru_cache(maxsize=None)
    def mask_words(self, state: int) -> np.ndarray:
        words = np.zeros(-(-self.vocab_size // 32), dtype=np.uint32)
        for tok in self.transitions[state]:
            words[tok >> 5] |= np.uint32(1 << (tok & 31))
        return words.view(np.int32)

    def step(self, state: int, tok: int) -> int:
        return self.transitions[state].get(tok, -1)

    def forced_run(self, state: int, limit: int) -> List[int]:
        """Tokens the grammar allows one way only, starting at `state`."""
        run: List[int] = []
        while len(run) < limit and state not in self.accept:
            nxt = self.transitions[state]
            if len(nxt) != 1:
                break
            (tok, state), = nxt.items()
            run.append(tok)
        return run

    def __hash__(self) -> int:
        return id(self)


def compile_template(template: str, char_tokens: Dict[str, int], string_tokens: Sequence[int]) -> TokenFSM:
    """`{"name": "{str}", "age": {str}}`-style templates: literal text is forced one
    character token at a time, each `{str}` slot accepts string tokens until a quote."""
    transitions: List[Dict[int, int]] = [{}]
    cur = 0
    parts = template.split("{str}")
    for i, lit in enumerate(parts):
        for ch in lit:
            transitions.append({})
            transitions[cur][char_tokens[ch]] = len(transitions) - 1
            cur = len(transitions) - 1
        if i < len(parts) - 1:
            slot = cur
            for t in string_tokens:
                transitions[slot][t] = slot
    vocab = max(max(char_tokens.values()), max(string_tokens)) + 1
    return TokenFSM(transitions, {cur}, vocab)


class GrammarMatcherPool:
    """Host-side matcher states plus the device bitmask the decode graphs apply."""

    def __init__(self, max_bs: int, vocab_size: int, max_jump: int, device: torch.device):
        self.max_bs = max_bs
        self.vocab_size = vocab_size
        self.words = -(-vocab_size // 32)
        self.max_jump = max_jump
        self.device = device
        self.token_bitmask = torch.full((max_bs, self.words), -1, dtype=torch.int32, device=device)
        self.bitmask_host = torch.empty(max_bs, self.words, dtype=torch.int32, pin_memory=True)
        self.allowed_count = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self._popcount = torch.tensor([bin(i).count("1") for i in range(256)], dtype=torch.int32, device=device)
        self.fsms: Dict[int, TokenFSM] = {}
        self.states: Dict[int, int] = {}

    def attach(self, rid: int, fsm: TokenFSM) -> None:
        self.fsms[rid] = fsm
        self.states[rid] = 0

    def detach(self, rid: int) -> None:
        self.fsms.pop(rid, None)
        self.states.pop(rid, None)

    def fill_bitmask(self, rids: List[int]) -> None:
        bs = len(rids)
        if bs > self.bitmask_host.shape[0]:
            self.bitmask_host = torch.empty(2 * bs, self.words, dtype=torch.int32, pin_memory=True)  # ok: FC107
        self.token_bitmask = torch.full((bs, self.words), -1, dtype=torch.int32, device=self.device)  # expect: FC107
        host = self.bitmask_host.numpy()
        for i, rid in enumerate(rids):
            fsm = self.fsms.get(rid)
            host[i] = -1 if fsm is None else fsm.mask_words(self.states[rid])
        self.token_bitmask.copy_(self.bitmask_host[:bs], non_blocking=True)
        per_byte = self._popcount[self.token_bitmask.view(torch.uint8).long()]
        self.allowed_count[:bs] = per_byte.sum(dim=1).to(torch.int32)

    def advance(self, rids: List[int], sampled_np: np.ndarray) -> Dict[int, List[int]]:
        """Accept last step's tokens; return the forced run of every row that has one."""
        for rid, tok in zip(rids, sampled_np.tolist()):
            fsm = self.fsms.get(rid)
            if fsm is not None:
                self.states[rid] = fsm.step(self.states[rid], tok)
        self.fill_bitmask(rids)
        # rows whose grammar state allows exactly one token are the jump-forward candidates
        single = torch.nonzero(self.allowed_count[: len(rids)] == 1).flatten().tolist()  # expect: FC101
        runs: Dict[int, List[int]] = {}
        for i in single:
            rid = rids[i]
            fsm = self.fsms[rid]
            run = fsm.forced_run(self.states[rid], self.max_jump)
            if run:
                runs[rid] = run
                for tok in run:
                    self.states[rid] = fsm.step(self.states[rid], tok)
        return runs


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    vocab = logits.shape[-1]
    idx = torch.arange(vocab, device=logits.device)
    bits = (bitmask[:, idx >> 5] >> (idx & 31)) & 1
    return logits.masked_fill(bits == 0, float("-inf"))

