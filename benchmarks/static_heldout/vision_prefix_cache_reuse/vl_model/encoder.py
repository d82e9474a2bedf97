"""Vision tower: patch embedding, bidirectional blocks, 2x2 merger into the language model's width."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class VisionConfig:
    patch: int = 14
    merge: int = 2
    width: int = 1280
    depth: int = 32
    heads: int = 16
    out_hidden: int = 3584
    page_size: int = 16


class VisionBlock(nn.Module):
    def __init__(self, cfg: VisionConfig, backend: str):
        super().__init__()
        self.heads = cfg.heads
        self.backend = backend
        self.norm1 = nn.LayerNorm(cfg.width)
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.width)
        self.norm2 = nn.LayerNorm(cfg.width)
        self.mlp = nn.Sequential(nn.Linear(cfg.width, 4 * cfg.width), nn.GELU(), nn.Linear(4 * cfg.width, cfg.width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(n, 3, self.heads, d // self.heads).permute(1, 2, 0, 3)
        o = F.scaled_dot_product_attention(q[None], k[None], v[None])[0]
        x = x + self.proj(o.permute(1, 0, 2).reshape(n, d))
        return x + self.mlp(self.norm2(x))


class VisionEncoder(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.cfg = cfg
        self._backend = "sdpa"
        self.patch_embed = nn.Conv2d(3, cfg.width, kernel_size=cfg.patch, stride=cfg.patch)
        self.blocks = nn.ModuleList([VisionBlock(cfg, self._backend) for _ in range(cfg.depth)])
        self.merger = nn.Sequential(nn.LayerNorm(cfg.width * cfg.merge ** 2),
                                    nn.Linear(cfg.width * cfg.merge ** 2, cfg.out_hidden))

    def forward(self, pixels: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Returns tile-padded embeddings (a whole number of KV pages) and the mask of real tokens."""
        cfg = self.cfg
        x = self.patch_embed(pixels[None])[0]  # [width, gh, gw]
        gh, gw = x.shape[1] // cfg.merge * cfg.merge, x.shape[2] // cfg.merge * cfg.merge
        x = x[:, :gh, :gw].flatten(1).t()
        for blk in self.blocks:
            x = blk(x)
        x = x.view(gh // cfg.merge, cfg.merge, gw // cfg.merge, cfg.merge, -1).permute(0, 2, 1, 3, 4)
        tokens = self.merger(x.reshape(-1, cfg.width * cfg.merge ** 2))
        n = tokens.shape[0]
        padded = -(-n // cfg.page_size) * cfg.page_size
        out = tokens.new_zeros(padded, cfg.out_hidden)
        out[:n] = tokens
        mask = torch.zeros(padded, dtype=torch.bool, device=tokens.device)
        mask[:n] = True
        return out, mask
