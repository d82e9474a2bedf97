"""Freezes the calibrated scales, requantizes live pages, and raises scales on drift later."""
from __future__ import annotations

from typing import List, Optional

import numpy as np
import torch

from fp8cal.attn.backend import Fp8DecodeBackend
from fp8cal.calib.observer import AmaxObserver
from fp8cal.calib.scale_math import amax_to_scale
from fp8cal.kv.cache import Fp8PagedKVCache
from fp8cal.settings import CalibSettings


class ScaleFreezer:
    def __init__(
        self,
        s: CalibSettings,
        cache: Fp8PagedKVCache,
        observer: AmaxObserver,
        backend: Fp8DecodeBackend,
        device: torch.device,
    ):
        self.s = s
        self.cache = cache
        self.observer = observer
        self.backend = backend
        self.device = device
        self._deq_scratch: Optional[torch.Tensor] = None
        self._steps_since_check = 0

    def _scratch(self) -> torch.Tensor:
        if self._deq_scratch is None:
            shape = (self.s.requant_chunk_pages, self.s.page_size, self.s.num_kv_heads, self.s.head_dim)
            self._deq_scratch = torch.empty(shape, dtype=torch.float32, device=self.device)  # ok: FC107
        return self._deq_scratch

    def _check_shape(self, layer_scales: torch.Tensor, what: str) -> None:
        if layer_scales.shape[0] != self.s.num_layers:
            raise ValueError(f"{what} scales must hold one entry per layer, got {layer_scales}")  # ok: FC101

    def freeze(self, page_lists: List[List[int]]) -> None:
        s = self.s
        new_k = amax_to_scale(self.observer.running_k, s.fp8_max, s.amax_margin)
        new_v = amax_to_scale(self.observer.running_v, s.fp8_max, s.amax_margin)
        self._check_shape(new_k, "K")
        old_k = self.cache.k_scale.clone()
        old_v = self.cache.v_scale.clone()
        self.cache.set_scales(new_k, new_v)
        live = np.unique(np.concatenate(page_lists)).tolist() if page_lists else []  # ok: FC101
        if live:
            ids = torch.tensor(live, dtype=torch.long, device=self.device)
            self.cache.requantize_pages(ids, old_k, new_k, old_v, new_v, self._scratch())
        self.backend.scales_frozen = True

    def _requantize_live_pages(self, page_lists: List[List[int]], old_k, new_k, old_v, new_v) -> None:
        flat = np.unique(np.concatenate(page_lists)).astype(np.int32)
        n = int(flat.size)
        # the decode graphs' index buffer is idle between replays: borrow it for the page list
        ids = self.backend.graph_kv_indices[:n]
        ids.copy_(torch.from_numpy(flat), non_blocking=True)  # expect: FC104
        self.cache.requantize_pages(ids.long(), old_k, new_k, old_v, new_v, self._scratch())

    def maybe_refreeze(self, page_lists: List[List[int]]) -> None:
        self._steps_since_check += 1
        if self._steps_since_check < self.s.drift_check_every or not page_lists:
            return
        self._steps_since_check = 0
        s = self.s
        window = s.drift_check_every
        # scales only grow: nothing already stored is clipped
        new_k = torch.maximum(amax_to_scale(self.observer.recent_max(window, 0), s.fp8_max, s.amax_margin), self.cache.k_scale)
        new_v = torch.maximum(amax_to_scale(self.observer.recent_max(window, 1), s.fp8_max, s.amax_margin), self.cache.v_scale)
        old_k = self.cache.k_scale.clone()
        old_v = self.cache.v_scale.clone()
        self._requantize_live_pages(page_lists, old_k, new_k, old_v, new_v)
        self.cache.k_scale.copy_(new_k)
        self.cache.v_scale = new_v.clone()  # expect: FC107
