from __future__ import annotations

import math
from typing import Sequence

import torch
from flashinfer.rope import apply_rope_with_cos_sin_cache_inplace


class LongRopeCache:
    """Short and long cos/sin caches, concatenated as vLLM's Phi3LongRoPE does."""

    def __init__(self, head_dim: int, short_factor: Sequence[float], long_factor: Sequence[float],
                 original_max: int, max_position: int, base: float, device: torch.device):
        assert len(short_factor) == head_dim // 2 and len(long_factor) == head_dim // 2  # expect: FC109
        self.head_dim = head_dim
        self.original_max = original_max
        self.max_position = max_position
        self.device = device
        scale = max_position / original_max
        self.mscale = math.sqrt(1 + math.log(scale) / math.log(original_max)) if scale > 1 else 1.0
        self.cos_sin_short = self._build(short_factor, original_max, base, 1.0)
        self.cos_sin_long = self._build(long_factor, max_position, base, self.mscale)
        self.cos_sin = torch.cat([self.cos_sin_short, self.cos_sin_long], dim=0)

    def _build(self, factor: Sequence[float], n_pos: int, base: float, mscale: float) -> torch.Tensor:
        ext = torch.tensor(factor, dtype=torch.float32, device=self.device)
        inv_freq = 1.0 / (ext * base ** (torch.arange(0, self.head_dim, 2, device=self.device).float() / self.head_dim))
        t = torch.arange(n_pos, dtype=torch.float32, device=self.device)
        freqs = torch.outer(t, inv_freq)
        return torch.cat([freqs.cos() * mscale, freqs.sin() * mscale], dim=-1)

    def cache_for(self, regime: str) -> torch.Tensor:
        return self.cos_sin_long if regime == "long" else self.cos_sin_short

    def select_regime(self, seq_lens_cpu: torch.Tensor) -> str:
        assert seq_lens_cpu.dim() == 1, "seq_lens must be 1-D"  # expect: FC109
        return "long" if int(seq_lens_cpu.max()) > self.original_max else "short"  # ok: FC101

    def rows_crossing(self, seq_lens_gpu: torch.Tensor) -> torch.Tensor:
        """Rows whose next token is the first past original_max: their KV must be recomputed."""
        return torch.nonzero(seq_lens_gpu == self.original_max + 1).flatten()  # expect: FC101

    def apply(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> None:
        assert self.cos_sin is not None  # ok: FC109
        # switch the whole batch to the long half of the cache once any position passes original_max
        offset = (torch.any(positions > self.original_max).long() * self.original_max)  # ok: FC101
        apply_rope_with_cos_sin_cache_inplace(positions + offset, q, k, self.head_dim, self.cos_sin, is_neox=True)
