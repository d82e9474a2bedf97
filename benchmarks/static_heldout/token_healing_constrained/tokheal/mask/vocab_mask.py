"""Per-step packed vocabulary mask (32 tokens per int32 word)."""
from __future__ import annotations

import logging
from typing import List, Optional

import numpy as np
import torch

from tokheal.mask.kernels import load_bitmask_kernel

logger = logging.getLogger(__name__)


def pack_allowed(allowed: np.ndarray, words: int) -> np.ndarray:
    bits = np.zeros(words * 32, dtype=np.uint8)
    bits[allowed] = 1
    packed = np.packbits(bits.reshape(words, 32)[:, ::-1], axis=1, bitorder="big")
    return packed.view(">u4").astype(np.uint32).view(np.int32).reshape(words)


class VocabMaskBuilder:
    def __init__(self, vocab_size: int, max_batch: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self.device = device
        self.mask_host = torch.zeros((max_batch, self.words), dtype=torch.int32, pin_memory=True)
        self.mask_dev = torch.zeros((max_batch, self.words), dtype=torch.int32, device=device)
        self._shifts = torch.arange(32, dtype=torch.int32, device=device)
        # compiled bitmask kernel, resolved on first use
        self._cached_module = None

    def kernel(self):
        if self._cached_module is None:  # ok: FC103
            self._cached_module = load_bitmask_kernel()
        return self._cached_module

    def fill_step_mask(self, rows_allowed: List[Optional[np.ndarray]]) -> torch.Tensor:
        bs = len(rows_allowed)
        if bs > self.mask_dev.shape[0]:
            self.mask_dev = torch.zeros((bs, self.words), dtype=torch.int32, device=self.device)  # expect: FC107
        mask_np = self.mask_host[:bs].numpy()
        mask_np.fill(-1)
        for i, allowed in enumerate(rows_allowed):
            if allowed is not None:
                mask_np[i] = pack_allowed(allowed, self.words)
        self.mask_dev[:bs].copy_(self.mask_host[:bs], non_blocking=True)
        live = ((self.mask_dev[:bs].unsqueeze(-1) >> self._shifts) & 1).sum(dim=(1, 2))
        if (live == 0).any():  # expect: FC101
            logger.warning("a constrained row allows no token; the trie and the vocabulary disagree")
        return self.mask_dev[:bs]
