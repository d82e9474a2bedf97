"""Drafting side: Medusa heads, the n-gram pool and the attention of the Jacobi lookahead branch."""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper

from . import limits as lim


class MedusaHeads:
    """Residual Medusa heads; called like a module on the last hidden states."""

    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int, tree_depths: List[int], device):
        self.heads = [torch.nn.Linear(hidden_size, vocab_size, bias=False).to(device) for _ in range(num_heads)]
        # depth of every node of the static Medusa tree; the gather kernels read it on the device
        self.tree_depths = torch.tensor(tree_depths, dtype=torch.int32, device=device)
        self.max_depth = max(tree_depths)

    def __call__(self, hidden_states: torch.Tensor) -> torch.Tensor:
        assert hidden_states.dim() == 2, "flatten the batch before the heads"  # expect: FC109
        return torch.stack([h(hidden_states) for h in self.heads], dim=1).argmax(-1)


class NgramPool:
    """Continuations seen after each key token; refreshed from the Jacobi window every step."""

    def __init__(self, ngram_size: int, pool_size: int):
        assert ngram_size >= 2, "an n-gram needs a key token and a continuation"  # expect: FC109
        self.ngram_size = ngram_size
        self.pool_size = pool_size
        self._entries: Dict[int, List[Tuple[int, ...]]] = {}
        self._count = 0
        self._listeners: Dict[str, List[Callable]] = {"refresh": [], "evict": []}

    def on(self, event: str, fn: Callable) -> None:
        self._listeners[event].append(fn)

    def _insert(self, key: int, ngram: Tuple[int, ...]) -> None:
        bucket = self._entries.setdefault(key, [])
        if ngram not in bucket:
            bucket.append(ngram)
            self._count += 1
        if len(bucket) > lim.NUM_CANDIDATES:
            bucket.pop(0)
            self._count -= 1

    def _evict(self) -> None:
        while self._count > self.pool_size:
            key = next(iter(self._entries))
            self._count -= len(self._entries.pop(key))
            for fn in self._listeners["evict"]:
                fn(key)
        assert self._count >= 0, "pool count went negative"  # ok: FC109

    def update(self, window_rows: List[List[int]]) -> None:
        n = self.ngram_size
        for row in window_rows:
            for i in range(len(row) - n + 1):
                self._insert(row[i], tuple(row[i + 1 : i + n]))
        self._evict()
        for fn in self._listeners["refresh"]:
            fn(self)

    def candidates(self, last_tokens: List[int]) -> Tuple[List[List[int]], Optional[np.ndarray]]:
        """Candidate continuations per request and the parent of every verify row (host)."""
        rows, parents = [], []
        for tok in last_tokens:
            cands = self._entries.get(tok, [])[: lim.NUM_CANDIDATES]
            rows.append([t for c in cands for t in c])
            par = list(range(-1, lim.LOOKAHEAD_WINDOW - 1))
            for c in cands:
                base = len(par)
                par.extend([lim.LOOKAHEAD_WINDOW - 1] + list(range(base, base + len(c) - 1)))
            parents.append(par)
        if not any(rows):
            return rows, None
        return rows, np.asarray([p + [-1] * (lim.NUM_VERIFY_TOKENS - len(p)) for p in parents], dtype=np.int32)


class LookaheadBranch:
    """Attention of the Jacobi window over itself (no KV cache): a ragged prefill, one segment per request."""

    def __init__(self, num_qo_heads: int, num_kv_heads: int, head_dim: int, max_batch_size: int, device):
        self.num_qo_heads = num_qo_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.workspace = torch.zeros(lim.BRANCH_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.workspace, "NHD")
        w = lim.LOOKAHEAD_WINDOW
        self.indptr_host = torch.arange(0, (max_batch_size + 1) * w, w, dtype=torch.int32)

    def plan(self, bs: int) -> None:
        indptr = self.indptr_host[: bs + 1]
        self.wrapper.plan(indptr, indptr, self.num_qo_heads, self.num_kv_heads, self.head_dim, causal=True)  # ok: FC102

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.wrapper.run(q, k, v)  # expect: FC108
