"""Token histories kept on the host; penalties are built from them every step."""

from __future__ import annotations

import threading
from typing import Dict, Iterable, Optional, Sequence, Tuple

import numpy as np
import torch

from vocabchunk.params import SamplingParams


class TokenHistory:
    """Per-request token counts, updated by the output thread, read by the step."""

    def __init__(self) -> None:
        self._counts: Dict[int, Dict[int, int]] = {}
        self._lock = threading.Lock()

    def observe(self, rid: int, tokens: Iterable[int]) -> None:
        with self._lock:
            c = self._counts.setdefault(rid, {})
            for tok in tokens:
                c[tok] = c.get(tok, 0) + 1

    def drop(self, rid: int) -> None:
        with self._lock:
            self._counts.pop(rid, None)

    def flatten(self, rids: Sequence[int]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Token ids, counts and entries per row, most frequent first within a row."""
        ids, counts, per_row = [], [], []
        with self._lock:
            for rid in rids:
                items = sorted(self._counts.get(rid, {}).items(), key=lambda kv: -kv[1])
                ids.extend(k for k, _ in items)
                counts.extend(v for _, v in items)
                per_row.append(len(items))
        return np.asarray(ids, np.int64), np.asarray(counts, np.float32), np.asarray(per_row, np.int64)


def bias_entries(params: Sequence[SamplingParams]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    ids = [tok for p in params for tok in p.logit_bias]
    vals = [b for p in params for b in p.logit_bias.values()]
    per_row = [len(p.logit_bias) for p in params]
    return np.asarray(ids, np.int64), np.asarray(vals, np.float32), np.asarray(per_row, np.int64)


def expand_rows(per_row: torch.Tensor, total: Optional[int] = None) -> torch.Tensor:
    """Row index of every entry, given how many entries each row has."""
    ar = torch.arange(per_row.numel(), device=per_row.device)
    if total is None:
        return torch.repeat_interleave(ar, per_row)  # expect: FC101
    return torch.repeat_interleave(ar, per_row, output_size=total)  # ok: FC101
