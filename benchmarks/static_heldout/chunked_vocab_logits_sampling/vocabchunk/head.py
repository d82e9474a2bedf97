"""The lm_head, applied one vocabulary chunk at a time, with a per-chunk top-k."""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import nn


def apply_chunk_penalties(
    logits: torch.Tensor,
    rows: torch.Tensor,
    token_ids: torch.Tensor,
    deltas: torch.Tensor,
    start: int,
    end: int,
) -> torch.Tensor:
    """Add the entries whose token falls in ``[start, end)``; the others add zero at column 0."""
    local = token_ids - start
    inside = (local >= 0) & (local < end - start)
    local = torch.where(inside, local, torch.zeros_like(local))  # ok: FC101
    delta = torch.where(inside, deltas, torch.zeros_like(deltas))
    logits.index_put_((rows, local), delta.to(logits.dtype), accumulate=True)
    return logits


class ChunkedLMHead(nn.Module):
    """Tied lm_head; only ``[rows, vocab_chunk]`` logits exist at a time."""

    def __init__(self, weight: nn.Parameter, chunk_size: int, max_top_k: int) -> None:
        super().__init__()
        assert chunk_size >= max_top_k, "a vocabulary chunk must hold a full top-k"  # expect: FC109
        self.weight = weight
        self.chunk_size = chunk_size
        self.max_top_k = max_top_k
        vocab = weight.shape[0]
        # the engine's own chunk plan: (start, end) of every vocabulary chunk
        self._plan_info: List[Tuple[int, int]] = [(s, min(s + chunk_size, vocab)) for s in range(0, vocab, chunk_size)]
        self.num_chunks = len(self._plan_info)

    @property
    def chunk_bounds(self) -> List[Tuple[int, int]]:
        return self._plan_info  # ok: FC103

    def topk_candidates(
        self,
        hidden: torch.Tensor,
        k: int,
        rows: Optional[torch.Tensor],
        token_ids: Optional[torch.Tensor],
        deltas: Optional[torch.Tensor],
        out_vals: torch.Tensor,
        out_ids: torch.Tensor,
    ) -> None:
        """Write each chunk's top-k values and global token ids into ``out_*[:, c*k:(c+1)*k]``."""
        for c, (start, end) in enumerate(self.chunk_bounds):
            logits = (hidden @ self.weight[start:end].t()).float()
            if deltas is not None:
                logits = apply_chunk_penalties(logits, rows, token_ids, deltas, start, end)
            vals, idx = torch.topk(logits, k, dim=-1)
            out_vals[:, c * k : (c + 1) * k].copy_(vals)
            out_ids[:, c * k : (c + 1) * k].copy_(idx + start)
