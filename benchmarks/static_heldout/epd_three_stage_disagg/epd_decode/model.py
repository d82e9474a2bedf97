"""The text decoder of the decode stage (multimodal RoPE positions, three sections)."""

from typing import List

import torch
from torch import nn

from epd.config import EPDConfig
from epd_decode.decode_attn import DecodeAttnBackend


def apply_mrope(x: torch.Tensor, positions: torch.Tensor, sections: List[int]) -> torch.Tensor:
    # positions: [3, tokens]; each section of the rotary half rotates by one of t / h / w
    half = x.shape[-1] // 2
    inv = 1.0 / (1000000.0 ** (torch.arange(half, device=x.device, dtype=torch.float32) / half))
    parts = []
    start = 0
    for axis, width in enumerate(sections):
        parts.append(positions[axis].float()[:, None] * inv[start : start + width])
        start += width
    ang = torch.cat(parts, dim=-1)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class DecodeLayer(nn.Module):
    def __init__(self, cfg: EPDConfig, backend: DecodeAttnBackend, layer_id: int) -> None:
        super().__init__()
        self.backend = backend
        self.layer_id = layer_id
        self.h, self.kvh, self.d = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.sections = [cfg.head_dim // 8, cfg.head_dim * 3 // 16, cfg.head_dim * 3 // 16]
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.q = nn.Linear(cfg.hidden_size, self.h * self.d)
        self.o = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False),
            nn.SiLU(),
            nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False),
        )

    def forward(self, x: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        q = apply_mrope(self.q(self.norm(x)).view(-1, self.h, self.d), positions, self.sections)
        o = self.backend.forward_decode(q, kv_cache, self.layer_id, bs)
        x = x + self.o(o.reshape(x.shape[0], -1))
        return x + self.mlp(x)


class DecodeLM(nn.Module):
    def __init__(self, cfg: EPDConfig, backend: DecodeAttnBackend) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecodeLayer(cfg, backend, i) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, input_ids, positions, kv_caches: List[torch.Tensor], bs: int) -> torch.Tensor:
        x = self.embed(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            x = layer(x, positions, kv, bs)
        return self.lm_head(self.norm(x))
