from __future__ import annotations

import torch
from torch import nn

from tokheal.config import HealConfig
from tokheal_srv.attention import HealAttention


class HealAttnLayer(nn.Module):
    def __init__(self, cfg: HealConfig, layer_id: int, attn: HealAttention) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.nq, self.nkv, self.hd = cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, (self.nq + 2 * self.nkv) * self.hd, bias=False)
        self.o = nn.Linear(self.nq * self.hd, cfg.hidden_size, bias=False)
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=False),
            nn.GELU(),
            nn.Linear(3 * cfg.hidden_size, cfg.hidden_size, bias=False),
        )
        self.attn = attn

    def _q(self, h: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(h)).split([self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], -1)
        self.attn.append_kv(self.layer_id, k.view(-1, self.nkv, self.hd), v.view(-1, self.nkv, self.hd))
        return q.view(-1, self.nq, self.hd)

    def _finish(self, h: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        h = h + self.o(out.reshape(-1, self.nq * self.hd))
        return h + self.mlp(h)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self._finish(h, self.attn.decode(self._q(h), self.layer_id))

    def forward_verify(self, h: torch.Tensor) -> torch.Tensor:
        return self._finish(h, self.attn.verify(self._q(h), self.layer_id))

    def forward_heal(self, h: torch.Tensor) -> torch.Tensor:
        return self._finish(h, self.attn.heal(self._q(h), self.layer_id))


class HealLM(nn.Module):
    def __init__(self, cfg: HealConfig, attn: HealAttention) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([HealAttnLayer(cfg, i, attn) for i in range(cfg.num_layers)])
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def decode_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)

    def verify_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids.reshape(-1))
        for layer in self.layers:
            h = layer.forward_verify(h)
        return self.head(h).view(ids.shape[0], ids.shape[1], -1)

    def prefill_tail(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for layer in self.layers:
            h = layer.forward_heal(h)
        return self.head(h)
