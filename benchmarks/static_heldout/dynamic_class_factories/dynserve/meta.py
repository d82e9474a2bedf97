"""Class machinery shared by models and graph runners.

``RegisteredMeta`` registers every class that names a ``kind`` (the model factory looks architectures
up by name) and wraps the class's own ``forward`` in an NVTX range. ``graph_replayable`` installs the
replay half of a CUDA graph runner on a plain class.
"""

from __future__ import annotations

import functools
import logging
from typing import Callable, Dict, Optional, Tuple

import torch

from .config import ENABLE_NVTX

logger = logging.getLogger(__name__)


def _wrap_forward(owner: str, fn: Callable) -> Callable:
    label = f"{owner}.forward"

    @functools.wraps(fn)
    def forward(self, *args, **kwargs):
        if not ENABLE_NVTX:
            return fn(self, *args, **kwargs)
        torch.cuda.nvtx.range_push(label)
        try:
            return fn(self, *args, **kwargs)
        finally:
            torch.cuda.nvtx.range_pop()

    forward.__wrapped_by_meta__ = True
    return forward


class RegisteredMeta(type):
    """Metaclass of every model module: registry by ``kind`` plus an NVTX-wrapped ``forward``."""

    kinds: Dict[str, type] = {}

    def __new__(mcls, name, bases, ns, kind: Optional[str] = None, **kwargs):
        if kind is not None:
            assert kind not in mcls.kinds, f"two classes register kind {kind!r}"  # expect: FC109
        fwd = ns.get("forward")
        if fwd is not None and not getattr(fwd, "__wrapped_by_meta__", False):
            ns["forward"] = _wrap_forward(name, fwd)
        cls = super().__new__(mcls, name, bases, ns, **kwargs)
        if kind is not None:
            mcls.kinds[kind] = cls
            cls.kind = kind
        return cls

    @classmethod
    def lookup(mcls, kind: str) -> type:
        try:
            return mcls.kinds[kind]
        except KeyError:
            raise ValueError(f"unknown kind {kind!r}; registered: {sorted(mcls.kinds)}") from None


def graph_replayable(*, static_inputs: Tuple[str, ...]):
    """Install ``prepare_replay`` and ``replay`` on a graph runner class.

    The class provides ``graphs``/``outputs`` (per padded batch size), ``backend``, ``max_bs``,
    ``max_seq_len``, ``padded_size()`` and one static device tensor per name in ``static_inputs``.
    """
    if not static_inputs:
        raise ValueError("a replayable runner needs at least one static input")

    def prepare_replay(self, batch) -> int:
        bs = batch.batch_size
        pad_bs = self.padded_size(bs)
        if (batch.seq_lens > self.max_seq_len).any():  # expect: FC101
            raise ValueError(f"seq_lens {batch.seq_lens} exceed the captured limit {self.max_seq_len}")  # ok: FC101
        for name in static_inputs:
            dst = getattr(self, name)
            src = getattr(batch, name)
            if src.shape[0] > dst.shape[0]:
                # multi-token speculative steps can outgrow the captured bucket: grow the static input
                setattr(self, name, torch.empty_like(src))  # expect: FC107
                dst = getattr(self, name)
            dst[: src.shape[0]].copy_(src, non_blocking=True)
        self.backend.init_forward_metadata_replay_cuda_graph(pad_bs, batch)
        if pad_bs > bs:
            # padded rows: repeat the last offset so the dummy rows attend to nothing
            self.backend.kv_indptr[bs + 1 : pad_bs + 1] = self.backend.kv_indptr[bs]  # expect: FC104
            self.positions[bs:pad_bs].zero_()  # ok: FC104
        return pad_bs

    def replay(self, batch):
        assert self.graphs, "capture() must run before replay()"  # ok: FC109
        assert batch.batch_size <= self.max_bs, "batch larger than the largest captured graph"  # expect: FC109
        pad_bs = self.prepare_replay(batch)
        self.graphs[pad_bs].replay()
        return self.outputs[pad_bs][: batch.batch_size]

    def deco(cls):
        setattr(cls, "static_inputs", tuple(static_inputs))
        setattr(cls, "prepare_replay", prepare_replay)
        setattr(cls, "replay", replay)
        logger.debug("installed replay on %s (static inputs %s)", cls.__name__, static_inputs)
        return cls

    return deco
