"""E2M1 (FP4) packing with FP8 block scales, on-the-fly dequantisation and host calibration."""

from typing import List

import numpy as np
import torch

from .constants import E2M1_MAX, FP4_BLOCK, FP8_E4M3_MAX

_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def e2m1_lut(device) -> torch.Tensor:
    """Magnitudes of the eight E2M1 codes (the sign is bit 3)."""
    return torch.tensor(_E2M1_VALUES, dtype=torch.float32, device=device)


def pack_e2m1(x: torch.Tensor, global_scale: torch.Tensor, block: int = FP4_BLOCK):
    """Quantise the last dimension of `x` to packed E2M1 nibbles with one FP8 scale per block."""
    assert x.shape[-1] % block == 0, "head_dim must be a multiple of the scale block"  # expect: FC109
    blocks = x.float().unflatten(-1, (-1, block))
    amax = blocks.abs().amax(dim=-1, keepdim=True).clamp_min(1e-6)
    scale = (amax / E2M1_MAX / global_scale).clamp(max=FP8_E4M3_MAX)
    q = blocks / (scale * global_scale)
    lut = e2m1_lut(x.device)
    codes = (q.abs().unsqueeze(-1) - lut).abs().argmin(dim=-1).to(torch.uint8)
    codes = torch.bitwise_or(codes, (q < 0).to(torch.uint8) * 8)
    codes = codes.flatten(-2)
    packed = torch.bitwise_or(codes[..., 0::2], torch.bitwise_left_shift(codes[..., 1::2], 4))
    return packed, scale.squeeze(-1).to(torch.float8_e4m3fn)


def unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    lo = torch.bitwise_and(packed, 0xF)
    hi = torch.bitwise_right_shift(packed, 4)
    return torch.stack([lo, hi], dim=-1).flatten(-2).long()


def dequant_pages(packed, scales, global_scale, page_ids, lut, out):
    """Dequantise pages `page_ids` of one layer's K or V into the leading rows of `out`."""
    codes = unpack_codes(packed.index_select(0, page_ids))
    s = scales.index_select(0, page_ids).float()
    mag = torch.take(lut, torch.bitwise_and(codes, 0x7))
    vals = torch.where(torch.bitwise_and(codes, 0x8) != 0, -mag, mag)  # ok: FC101
    vals = vals.unflatten(-1, (-1, FP4_BLOCK)) * s.unsqueeze(-1) * global_scale
    out[: page_ids.shape[0]].copy_(vals.flatten(-2).to(out.dtype))
    return out


class Calibrator:
    """Collects per-layer K/V amax on the host and turns it into per-layer global scales."""

    def __init__(self, num_layers: int, percentile: float = 99.9):
        self.percentile = percentile
        self.samples: List[List[np.ndarray]] = [[] for _ in range(num_layers)]

    def observe(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        amax_np = torch.stack([k.abs().amax(), v.abs().amax()]).float().cpu().numpy()  # ok: FC101
        self.samples[layer].append(amax_np)

    def global_scales(self) -> np.ndarray:
        out_np = np.ones(len(self.samples), dtype=np.float32)
        for i, rows in enumerate(self.samples):
            if rows:
                stacked = np.stack(rows)
                out_np[i] = np.percentile(stacked, self.percentile) / (E2M1_MAX * FP8_E4M3_MAX)
        return out_np

    def reset(self) -> None:
        for rows in self.samples:
            rows.clear()
