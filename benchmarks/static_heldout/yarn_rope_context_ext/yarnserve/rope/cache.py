"""One cos/sin table per band, grown on demand."""
from __future__ import annotations

from typing import List

import numpy as np
import torch

from yarnserve.bands import BandTable, RopeBand
from yarnserve.rope.yarn import inv_freq_for_band
from yarnserve.settings import ServeSettings


class BandRopeCache:
    def __init__(self, table: BandTable, settings: ServeSettings, device: torch.device) -> None:
        self.table = table
        self.settings = settings
        self.device = device
        self.rot_dim = settings.head_dim
        self._backend = "triton" if settings.fused_rope else "torch"
        self.cos_sin: List[torch.Tensor] = []
        for band in table.bands:
            n = min(band.max_len, settings.initial_rope_len)
            self.cos_sin.append(torch.zeros((n, 2, self.rot_dim // 2), dtype=torch.float32, device=device))
            self.cos_sin[-1].copy_(self._rows(band, 0, n))
        self.cached_len_np = np.array([t.shape[0] for t in self.cos_sin], dtype=np.int64)

    def _rows(self, band: RopeBand, start: int, stop: int) -> torch.Tensor:
        inv = inv_freq_for_band(
            band, self.rot_dim, self.settings.rope_base, self.settings.original_max_position, self.device
        )
        t = torch.arange(start, stop, dtype=torch.float32, device=self.device)
        freqs = torch.outer(t, inv)
        return torch.stack([freqs.cos() * band.mscale, freqs.sin() * band.mscale], dim=1)

    def ensure(self, band_idx: int, need: int) -> None:
        have = int(self.cached_len_np[band_idx])
        if need <= have:
            return
        band = self.table[band_idx]
        stop = min(band.max_len, max(need, 2 * have))
        self.cos_sin[band_idx] = torch.cat([self.cos_sin[band_idx], self._rows(band, have, stop)], dim=0)  # expect: FC107
        self.cached_len_np[band_idx] = stop

    def warm(self, band_idx: int) -> None:
        # touch the table so the fused kernel's autotuner sees its final stride
        self.cos_sin[band_idx].contiguous()

    def gather(self, band_idx: int, positions: torch.Tensor) -> torch.Tensor:
        # the fused kernel wants the used prefix of the table only
        table = self.cos_sin[band_idx][: positions.max() + 1]  # expect: FC101
        return table.index_select(0, positions)
