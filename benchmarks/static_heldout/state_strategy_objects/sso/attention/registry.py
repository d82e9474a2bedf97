"""Strategies keyed by batch kind; the runner swaps ``runner.strategy`` from here every step."""

from __future__ import annotations

from typing import Iterator

from sso.attention.backend import FlashInferBackend
from sso.attention.strategies import AttentionStrategy, NullStrategy
from sso.config import BatchKind
from sso.forward_batch import ForwardBatch


class StrategyRegistry:
    def __init__(self, backend: FlashInferBackend) -> None:
        self.backend = backend
        self._eager: dict[BatchKind, AttentionStrategy] = {}
        self._graph: dict[BatchKind, AttentionStrategy] = {}

    def register(self, kind: BatchKind, strategy: AttentionStrategy, graph: bool = False) -> None:
        table = self._graph if graph else self._eager
        assert kind not in table, f"{kind} registered twice"  # expect: FC109
        table[kind] = strategy

    def kinds(self) -> Iterator[BatchKind]:
        return iter(list(self._eager))

    def get(self, kind: BatchKind) -> AttentionStrategy:
        strategy = self._eager.get(kind)
        if strategy is None:
            return NullStrategy(self.backend)
        return strategy

    def for_capture(self, kind: BatchKind) -> AttentionStrategy:
        # kinds without a graph-mode strategy fall back to the eager one
        return self._graph.get(kind) or self._eager[kind]

    def classify(self, batch: ForwardBatch) -> BatchKind:
        if batch.batch_size == 0:
            return BatchKind.IDLE
        if batch.num_prefills:  # ok: FC101
            if batch.prefix_lens is not None and self.backend.cfg.enable_cascade:
                return BatchKind.CASCADE
            return BatchKind.PREFILL
        bs = batch.batch_size
        if (batch.qo_indptr[1 : bs + 1] - batch.qo_indptr[:bs] > 1).any():  # expect: FC101
            raise ValueError(f"decode batch with multi-token rows: {batch.qo_indptr}")  # ok: FC101
        return BatchKind.DECODE

    def _check_internal(self) -> None:
        n = len(self._eager)
        assert n >= len(self._graph)  # ok: FC109
