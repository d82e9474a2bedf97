"""A ViT-style vision tower whose attention runs on FlashInfer's ragged prefill."""

import flashinfer
import torch
from torch import nn

from vlm import VLMConfig


class VisionAttention(nn.Module):
    def __init__(self, cfg: VLMConfig, workspace: torch.Tensor):
        super().__init__()
        self.num_heads = cfg.vision_heads
        self.head_dim = cfg.vision_hidden // cfg.vision_heads
        self.qkv = nn.Linear(cfg.vision_hidden, 3 * cfg.vision_hidden)
        self.proj = nn.Linear(cfg.vision_hidden, cfg.vision_hidden)
        # images are independent sequences: non-causal attention over cu_seqlens
        self.wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD")

    def plan_images(self, cu_seqlens_host: torch.Tensor) -> None:
        self.wrapper.plan(  # ok: FC102
            qo_indptr=cu_seqlens_host,
            kv_indptr=cu_seqlens_host,
            num_qo_heads=self.num_heads,
            num_kv_heads=self.num_heads,
            head_dim_qk=self.head_dim,
            causal=False,
            q_data_type=torch.bfloat16,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.num_heads, self.head_dim).unbind(1)
        out = self.wrapper.run(q, k, v)  # expect: FC108
        return self.proj(out.reshape(n, -1))


class VisionBlock(nn.Module):
    def __init__(self, cfg: VLMConfig, workspace: torch.Tensor):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.vision_hidden)
        self.attn = VisionAttention(cfg, workspace)
        self.norm2 = nn.LayerNorm(cfg.vision_hidden)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.vision_hidden, 4 * cfg.vision_hidden),
            nn.GELU(approximate="tanh"),
            nn.Linear(4 * cfg.vision_hidden, cfg.vision_hidden),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTower(nn.Module):
    def __init__(self, cfg: VLMConfig, workspace: torch.Tensor):
        super().__init__()
        self.patch_embed = nn.Linear(cfg.patch_dim, cfg.vision_hidden, bias=False)
        self.blocks = nn.ModuleList([VisionBlock(cfg, workspace) for _ in range(cfg.vision_layers)])
        # 2x2 patch merger into the language model's hidden size
        self.merger = nn.Sequential(
            nn.LayerNorm(4 * cfg.vision_hidden),
            nn.Linear(4 * cfg.vision_hidden, cfg.hidden_size),
        )

    def plan_images(self, cu_seqlens_host: torch.Tensor) -> None:
        for blk in self.blocks:
            blk.attn.plan_images(cu_seqlens_host)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(pixel_values)
        for blk in self.blocks:
            x = blk(x)
        return self.merger(x.reshape(-1, 4 * x.shape[-1]))
