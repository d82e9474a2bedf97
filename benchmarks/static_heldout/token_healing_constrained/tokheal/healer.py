"""Back off the prompt's last tokens and constrain their re-decoding."""
from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional

import numpy as np

from tokheal.trie import PrefixTrie


@dataclasses.dataclass
class HealPlan:
    kept_ids: List[int]
    removed_text: bytes
    allowed_first: np.ndarray
    remaining: bytes = b""

    def allowed_next(self, trie: PrefixTrie) -> Optional[np.ndarray]:
        if not self.remaining:
            return None
        return trie.allowed_ids(self.remaining)

    def advance(self, token_text: bytes) -> None:
        n = min(len(token_text), len(self.remaining))
        self.remaining = self.remaining[n:]


class TokenHealer:
    def __init__(self, trie: PrefixTrie, detokenize: Callable[[List[int]], bytes]) -> None:
        self.trie = trie
        self.detokenize = detokenize

    def back_off(self, prompt_ids: List[int], max_tokens: int) -> HealPlan:
        assert max_tokens >= 1, "token healing backs off at least one token"  # expect: FC109
        k = min(max_tokens, len(prompt_ids))
        removed = self.detokenize(prompt_ids[-k:])
        allowed = self.trie.allowed_ids(removed[:1])
        return HealPlan(kept_ids=list(prompt_ids[:-k]), removed_text=removed, allowed_first=allowed, remaining=removed)
