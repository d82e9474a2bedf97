"""Grammar-constrained decoding: matchers fill a pinned host bitmask; the device applies it."""
from __future__ import annotations

from typing import Dict, List, Protocol

import numpy as np
import torch


class TokenMatcher(Protocol):
    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int) -> None: ...

    def accept_token(self, token: int) -> bool: ...


class GrammarBitmaskStager:
    def __init__(self, max_bs: int, vocab: int, backend: str = "xgrammar"):
        self._backend = backend
        self.vocab = vocab
        self.words = (vocab + 31) // 32
        self.bitmask_host = torch.full((max_bs, self.words), -1, dtype=torch.int32, pin_memory=True)
        self.matchers: Dict[int, TokenMatcher] = {}

    @property
    def backend_name(self) -> str:
        return self._backend  # ok: FC103

    def add(self, req_id: int, matcher: TokenMatcher) -> None:
        self.matchers[req_id] = matcher

    def remove(self, req_id: int) -> None:
        self.matchers.pop(req_id, None)

    def fill(self, req_ids: List[int]) -> bool:
        """Fill the rows of constrained requests; unconstrained rows allow every token."""
        n = len(req_ids)
        self.bitmask_host[:n].fill_(-1)
        constrained = False
        for i, rid in enumerate(req_ids):
            m = self.matchers.get(rid)
            if m is not None:
                m.fill_next_token_bitmask(self.bitmask_host, i)
                constrained = True
        return constrained

    def advance(self, req_ids: List[int], tokens_np: np.ndarray) -> None:
        for rid, tok in zip(req_ids, tokens_np.tolist()):
            m = self.matchers.get(rid)
            if m is not None and not m.accept_token(int(tok)):
                raise RuntimeError(f"request {rid}: sampled token {tok} violates its grammar")


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    bits = torch.arange(32, device=logits.device, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> bits) & 1).bool().flatten(1)[:, : logits.shape[1]]
    return logits.masked_fill_(~allowed, float("-inf"))  # ok: FC101
