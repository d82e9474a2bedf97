"""Per-page scale tracking: pages whose contents outgrow their scale get requantized."""
from __future__ import annotations

from typing import List

import torch

from qkv.config import FP8_E4M3_MAX, QuantKVConfig
from qkv.scales import PageScaleTable


class ScaleTracker:
    def __init__(self, cfg: QuantKVConfig, scales: PageScaleTable, device: torch.device):
        self.cfg = cfg
        self.scales = scales
        self.device = device
        self.fp8_max = FP8_E4M3_MAX
        self.rows = torch.arange(cfg.max_batch_size, device=device)
        self.requant_layers: List[int] = []

    def observe_step(self, layer: int, page_ids: torch.Tensor, new_amax: torch.Tensor, tokens_per_row: torch.Tensor, n_pages: int) -> None:
        """Folds this step's per-row absmax into the running absmax of each touched page."""
        amax = self.scales.page_amax[layer]
        row_of_page = torch.repeat_interleave(self.rows[: tokens_per_row.shape[0]], tokens_per_row, output_size=n_pages)  # ok: FC101
        amax.index_reduce_(0, page_ids, new_amax[row_of_page], "amax")
        limit = self.fp8_max * self.scales.k_scale[layer, page_ids].amax(dim=(-1, -2)).float()
        overflow = amax[page_ids] > limit
        if overflow.any():  # expect: FC101
            self.requant_layers.append(layer)

    def pending_requant(self) -> List[int]:
        layers, self.requant_layers = self.requant_layers, []
        return sorted(set(layers))
