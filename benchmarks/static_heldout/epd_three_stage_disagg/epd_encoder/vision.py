"""A ViT over variable-resolution images (patches of all images concatenated)."""

from typing import List

import torch
import torch.nn.functional as F
from torch import nn


class VisionAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self._sm_scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, seq_sizes: List[int]) -> torch.Tensor:
        q, k, v = self.qkv(x).view(-1, 3, self.heads, self.head_dim).unbind(1)
        outs = []
        for qs, ks, vs in zip(q.split(seq_sizes), k.split(seq_sizes), v.split(seq_sizes)):
            o = F.scaled_dot_product_attention(
                qs.transpose(0, 1), ks.transpose(0, 1), vs.transpose(0, 1),
                scale=self._sm_scale,  # ok: FC103
            )
            outs.append(o.transpose(0, 1))
        return self.proj(torch.cat(outs).reshape(x.shape))


class VisionBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = VisionAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, seq_sizes: List[int]) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), seq_sizes)
        return x + self.mlp(self.norm2(x))


class VisionEncoder(nn.Module):
    def __init__(self, patch_dim: int, dim: int, heads: int, layers: int, out_dim: int, merge: int) -> None:
        super().__init__()
        self.merge = merge
        self.patch_embed = nn.Linear(patch_dim, dim, bias=False)
        self.blocks = nn.ModuleList([VisionBlock(dim, heads) for _ in range(layers)])
        self.merger = nn.Sequential(nn.LayerNorm(dim * merge * merge), nn.Linear(dim * merge * merge, out_dim))

    def forward(self, patches: torch.Tensor, seq_sizes: List[int]) -> torch.Tensor:
        x = self.patch_embed(patches)
        for blk in self.blocks:
            x = blk(x, seq_sizes)
        return self.merger(x.reshape(-1, x.shape[-1] * self.merge * self.merge))
