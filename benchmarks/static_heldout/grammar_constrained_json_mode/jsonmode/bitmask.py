"""Allowed-token bitmasks: numpy on the host, a pinned staging buffer, a device buffer the sampler reads."""
from __future__ import annotations

from typing import Sequence

import flashcheck
import numpy as np
import torch

from .automaton import JsonAutomaton


class GrammarDeadEnd(RuntimeError):
    pass


class BitmaskBuilder:
    def __init__(self, vocab_size: int, max_batch: int, device: torch.device) -> None:
        assert vocab_size % 32 == 0, "pad the vocabulary to a multiple of 32"  # expect: FC109
        self.words = vocab_size // 32
        self.device = device
        self.mask_pinned = torch.zeros(max_batch, self.words, dtype=torch.int32, pin_memory=True)
        self.mask_np = self.mask_pinned.numpy()
        self.mask_device = torch.zeros(max_batch, self.words, dtype=torch.int32, device=device)
        self._backend = "numpy"

    @flashcheck.hot_path
    def stage(self, automaton: JsonAutomaton, rids: Sequence[int]) -> int:
        bs = len(rids)
        if self.mask_pinned.shape[0] < bs:
            self.mask_pinned = torch.zeros(bs, self.words, dtype=torch.int32, pin_memory=True)  # ok: FC107
            self.mask_np = self.mask_pinned.numpy()
        if self.mask_device.shape[0] < bs:
            self.mask_device = torch.zeros(bs, self.words, dtype=torch.int32, device=self.device)  # expect: FC107
        if self._backend == "numpy":  # ok: FC103
            for i, rid in enumerate(rids):
                self.mask_np[i] = automaton.allowed_words(rid)
        dead = ~self.mask_np[:bs].any(axis=1)
        if dead.any():  # ok: FC101
            raise GrammarDeadEnd(f"no allowed token for rows {np.flatnonzero(dead).tolist()}")
        self.mask_device[:bs].copy_(self.mask_pinned[:bs], non_blocking=True)  # ok: FC101
        if not self.mask_device[:bs].any():  # expect: FC101
            raise GrammarDeadEnd("every row's mask is empty")
        return bs

    def mask_density(self) -> float:
        return float(self.mask_device.float().mean())  # ok: FC101
