"""Prompt groups and their sampled completions (host-side state)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Tuple


def split_prefix_pages(prompt_len: int, page_size: int) -> Tuple[int, int]:
    """(number of full prompt pages every sample shares, tokens on the partial last page)."""
    return prompt_len // page_size, prompt_len % page_size


@dataclass
class Completion:
    sample_idx: int
    req_slot: int
    page_ids: List[int] = field(default_factory=list)
    token_ids: List[int] = field(default_factory=list)
    logprobs: List[float] = field(default_factory=list)
    finished: bool = False


@dataclass
class PromptGroup:
    group_id: int
    prompt_ids: List[int]
    prompt_page_ids: List[int] = field(default_factory=list)
    completions: List[Completion] = field(default_factory=list)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def done(self) -> bool:
        return bool(self.completions) and all(c.finished for c in self.completions)

    def live(self) -> List[Completion]:
        return [c for c in self.completions if not c.finished]
