"""A Qwen-shaped decoder; attention goes through the DCP backend."""
from __future__ import annotations

import torch
from torch import nn

from dcp.config import DCPConfig
from dcp_srt.backend import DCPFlashInferBackend
from dcp_srt.forward_batch import ForwardBatch


def rotate(x: torch.Tensor, positions: torch.Tensor, base: float = 1000000.0) -> torch.Tensor:
    d = x.shape[-1]
    freqs = base ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ang = positions.float()[:, None] * freqs
    c, s = ang.cos()[:, None], ang.sin()[:, None]
    a, b = x[..., : d // 2].float(), x[..., d // 2 :].float()
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1).type_as(x)


class DCPAttention(nn.Module):
    def __init__(self, layer_id: int, cfg: DCPConfig, backend: DCPFlashInferBackend):
        super().__init__()
        self.layer_id = layer_id
        self.h, self.kvh, self.d = cfg.num_local_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, (self.h + 2 * self.kvh) * self.d, bias=True)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)
        self.backend = backend

    def forward(self, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.h * self.d, self.kvh * self.d, self.kvh * self.d], dim=-1)
        q = rotate(q.view(-1, self.h, self.d), fb.positions)
        k = rotate(k.view(-1, self.kvh, self.d), fb.positions)
        o = self.backend.forward_decode(q, k, v.view(-1, self.kvh, self.d), self.layer_id, fb)
        return self.o_proj(o.reshape(x.shape[0], -1))


class DecoderLayer(nn.Module):
    def __init__(self, layer_id: int, cfg: DCPConfig, backend: DCPFlashInferBackend):
        super().__init__()
        self.ln1 = nn.RMSNorm(cfg.hidden_size)
        self.ln2 = nn.RMSNorm(cfg.hidden_size)
        self.attn = DCPAttention(layer_id, cfg, backend)
        self.up = nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size, bias=False)
        self.down = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)

    def forward(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = h + self.attn(self.ln1(h), fb)
        g, u = self.up(self.ln2(h)).chunk(2, dim=-1)
        return h + self.down(nn.functional.silu(g) * u)


class DCPModel(nn.Module):
    def __init__(self, cfg: DCPConfig, backend: DCPFlashInferBackend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(i, cfg, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, fb)
        return self.lm_head(self.norm(h))
