"""Watermark detection: a one-proportion z-test on the share of green tokens."""
from __future__ import annotations

import math

import torch

from wmserve.watermark.greenlist import GreenListBias, GreenListTable


class WatermarkDetector:
    def __init__(self, table: GreenListTable, bias: GreenListBias):
        self.table = table
        self.bias = bias

    def z_score(self, token_ids: torch.Tensor) -> float:
        prev, cur = token_ids[:-1], token_ids[1:]
        green = self.table.green_mask(self.bias.bucket_ids(prev)).gather(1, cur.unsqueeze(1)).squeeze(1)
        n = cur.numel()
        hits = green.sum().item()  # ok: FC101
        g = self.table.gamma
        return (hits - g * n) / math.sqrt(max(n, 1) * g * (1 - g))

    def is_watermarked(self, token_ids: torch.Tensor, threshold: float = 4.0) -> bool:
        return self.z_score(token_ids) > threshold
