"""Local encoder, global patch transformer and local decoder."""
from __future__ import annotations

import torch
from torch import nn

from blt import ByteModelConfig
from blt_attn.backend import GlobalAttentionBackend


class LocalEncoder(nn.Module):
    def __init__(self, cfg: ByteModelConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.num_byte_tokens, cfg.local_dim)
        self.mix = nn.Sequential(*[nn.Linear(cfg.local_dim, cfg.local_dim) for _ in range(cfg.num_local_layers)])
        self.up = nn.Linear(cfg.local_dim, cfg.global_dim)

    def forward(self, byte_ids: torch.Tensor, patch_index: torch.Tensor) -> torch.Tensor:
        h = self.mix(self.embed(byte_ids)).flatten(0, 1)
        pooled = torch.zeros(byte_ids.shape[0], h.shape[-1], dtype=h.dtype, device=h.device)
        pooled.index_add_(0, patch_index, h)
        return self.up(pooled), h


class GlobalLayer(nn.Module):
    def __init__(self, cfg: ByteModelConfig, backend: GlobalAttentionBackend, layer_id: int) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.heads = cfg.num_qo_heads
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(cfg.global_dim, cfg.num_qo_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.global_dim, bias=False)
        self.mlp = nn.Sequential(nn.Linear(cfg.global_dim, 4 * cfg.global_dim), nn.GELU(),
                                 nn.Linear(4 * cfg.global_dim, cfg.global_dim))

    def forward(self, x: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(x).view(-1, self.heads, self.head_dim)
        attn = self.backend.forward_decode(q, kv_cache[self.layer_id])
        x = x + self.o_proj(attn.flatten(1))
        return x + self.mlp(x)


class GlobalTransformer(nn.Module):
    def __init__(self, cfg: ByteModelConfig, backend: GlobalAttentionBackend) -> None:
        super().__init__()
        self.backend = backend
        self.layers = nn.ModuleList([GlobalLayer(cfg, backend, i) for i in range(cfg.num_global_layers)])

    def forward(self, patch_h: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        fm = self.backend.forward_meta
        # per-row patch offsets, computed into the bucket's indptr row to save an allocation
        ones = torch.ones(fm.bs, dtype=torch.int32, device=patch_h.device)
        torch.cumsum(ones, 0, out=fm.kv_indptr[1:])  # expect: FC104
        for layer in self.layers:
            patch_h = layer(patch_h, kv_cache)
        return patch_h


class LocalDecoder(nn.Module):
    def __init__(self, cfg: ByteModelConfig, backend: GlobalAttentionBackend) -> None:
        super().__init__()
        self.backend = backend
        self.heads = cfg.num_qo_heads
        self.head_dim = cfg.head_dim
        self.q = nn.Linear(cfg.local_dim, cfg.num_qo_heads * cfg.head_dim)
        self.kv = nn.Linear(cfg.global_dim, 2 * cfg.num_kv_heads * cfg.head_dim)
        self.out = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.num_byte_tokens)

    def forward(self, byte_h: torch.Tensor, patch_h: torch.Tensor) -> torch.Tensor:
        q = self.q(byte_h).view(-1, self.heads, self.head_dim)
        k, v = self.kv(patch_h).view(patch_h.shape[0], 2, -1, self.head_dim).unbind(1)
        ctx = self.backend.cross_attend(q, k, v)
        return self.out(ctx.flatten(1))


class ByteLatentModel(nn.Module):
    def __init__(self, cfg: ByteModelConfig, backend: GlobalAttentionBackend) -> None:
        super().__init__()
        self.encoder = LocalEncoder(cfg)
        self.global_model = GlobalTransformer(cfg, backend)
        self.decoder = LocalDecoder(cfg, backend)

    def forward(self, byte_ids: torch.Tensor, patch_index: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        patch_h, byte_h = self.encoder(byte_ids, patch_index)
        patch_h = self.global_model(patch_h, kv_cache)
        return self.decoder(byte_h, patch_h).view(byte_ids.shape[0], byte_ids.shape[1], -1)
