"""Per-slot token counts on the device, the input of repetition/presence/frequency penalties."""
from __future__ import annotations

from typing import List

import torch


class TokenHistory:
    def __init__(self, max_slots: int, vocab: int, device: torch.device):
        self.vocab = vocab
        self.counts = torch.zeros(max_slots, vocab, dtype=torch.int32, device=device)

    def reset_rows(self, rows: List[int], prompt_tokens: List[List[int]]) -> None:
        """Start a slot's history from its prompt (penalties apply to prompt tokens too)."""
        assert len(rows) == len(prompt_tokens)  # expect: FC109
        for row, toks in zip(rows, prompt_tokens):
            self.counts[row].zero_()
            if toks:
                t = torch.tensor(toks, dtype=torch.int64).to(self.counts.device, non_blocking=True)
                self.counts[row].index_add_(0, t, torch.ones_like(t, dtype=torch.int32))

    def gather(self, slots: torch.Tensor) -> torch.Tensor:
        return self.counts.index_select(0, slots)

    def record(self, slots: torch.Tensor, tokens: torch.Tensor) -> None:
        ones = torch.ones_like(tokens, dtype=torch.int32)
        self.counts.index_put_((slots, tokens.long()), ones, accumulate=True)
