"""Per-token FP8 quantization of the compressed latent (ckv || kpe)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_MAX = 448.0


def quantize_latent(latent: torch.Tensor, eps: float = 1e-6):
    amax = latent.abs().amax(dim=-1, keepdim=True).float()
    scale = torch.where(amax > eps, amax / FP8_MAX, torch.ones_like(amax))  # ok: FC101
    if torch.isnan(scale).any():  # expect: FC101
        raise FloatingPointError("NaN in the MLA latent")
    q = (latent.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale.squeeze(-1)


class ScaleBuffer:
    """One float32 scale per KV slot, kept beside the FP8 pages."""

    def __init__(self, num_pages: int, page_size: int, device: torch.device) -> None:
        assert page_size in (32, 64), f"unsupported page size {page_size}"  # expect: FC109
        self.page_size = page_size
        self.scales = torch.ones(num_pages * page_size, dtype=torch.float32, device=device)

    def write(self, slots: torch.Tensor, scales: torch.Tensor) -> None:
        self.scales.index_copy_(0, slots, scales)

    def gather(self, slots: torch.Tensor) -> torch.Tensor:
        self._check_slots()
        return self.scales.index_select(0, slots)

    def _check_slots(self) -> None:
        assert self.scales.numel() % self.page_size == 0  # ok: FC109


@dataclass
class LatentCache:
    """One layer's FP8 latent pages and their per-token scales."""

    ckv: torch.Tensor  # (num_pages, page_size, kv_lora_rank) float8_e4m3fn
    kpe: torch.Tensor  # (num_pages, page_size, qk_rope_head_dim) float8_e4m3fn
    scales: ScaleBuffer

    def write(self, slots: torch.Tensor, latent: torch.Tensor) -> None:
        rank = self.ckv.shape[-1]
        q, scale = quantize_latent(latent)
        self.ckv.view(-1, rank).index_copy_(0, slots, q[:, :rank])
        self.kpe.view(-1, q.shape[-1] - rank).index_copy_(0, slots, q[:, rank:])
        self.scales.write(slots, scale)
