"""Qwen2-VL-style vision tower; window-free ViT attention over ragged per-frame sequences."""
from __future__ import annotations

import torch
import torch.nn as nn
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper

from pvlm.config import VIT_WORKSPACE_MB, VLMConfig
from pvlm.vision.encoder_cache import MMInputs


class VisionBlock(nn.Module):
    def __init__(self, cfg: VLMConfig):
        super().__init__()
        self.heads = cfg.vision_heads
        self.head_dim = cfg.vision_hidden // cfg.vision_heads
        self.norm1 = nn.LayerNorm(cfg.vision_hidden)
        self.qkv = nn.Linear(cfg.vision_hidden, 3 * cfg.vision_hidden)
        self.proj = nn.Linear(cfg.vision_hidden, cfg.vision_hidden)
        self.norm2 = nn.LayerNorm(cfg.vision_hidden)
        self.mlp = nn.Sequential(nn.Linear(cfg.vision_hidden, 4 * cfg.vision_hidden), nn.GELU(), nn.Linear(4 * cfg.vision_hidden, cfg.vision_hidden))

    def forward(self, x: torch.Tensor, wrapper: BatchPrefillWithRaggedKVCacheWrapper) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).view(-1, 3, self.heads, self.head_dim).unbind(1)
        x = x + self.proj(wrapper.run(q, k, v).reshape(x.shape[0], -1))
        return x + self.mlp(self.norm2(x))


class VisionTower(nn.Module):
    def __init__(self, cfg: VLMConfig, device: torch.device):
        super().__init__()
        self.cfg = cfg
        m = cfg.spatial_merge_size
        patch_dim = 3 * cfg.temporal_patch * cfg.patch_size * cfg.patch_size
        self.vit_workspace = torch.zeros(VIT_WORKSPACE_MB << 20, dtype=torch.uint8, device=device)  # expect: FC106
        self.vit_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.vit_workspace, "NHD")
        self.patch_embed = nn.Linear(patch_dim, cfg.vision_hidden, bias=False)
        self.blocks = nn.ModuleList([VisionBlock(cfg) for _ in range(cfg.vision_layers)])
        self.merger = nn.Sequential(nn.LayerNorm(cfg.vision_hidden * m * m), nn.Linear(cfg.vision_hidden * m * m, cfg.hidden_size))

    @torch.inference_mode()
    def encode(self, mm: MMInputs) -> torch.Tensor:
        c = self.cfg
        t, h, w = mm.grid_thw_host
        cu_seqlens = torch.tensor([0] + [h * w] * t, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        num_patches = cu_seqlens[-1].item()  # ok: FC101
        head_dim = c.vision_hidden // c.vision_heads
        self.vit_wrapper.plan(  # ok: FC102
            cu_seqlens, cu_seqlens, c.vision_heads, c.vision_heads, head_dim, causal=False, q_data_type=c.dtype
        )
        x = self.patch_embed(mm.pixel_values[:num_patches])
        for blk in self.blocks:
            x = blk(x, self.vit_wrapper)
        m2 = c.spatial_merge_size * c.spatial_merge_size
        return self.merger(x.view(num_patches // m2, -1))
