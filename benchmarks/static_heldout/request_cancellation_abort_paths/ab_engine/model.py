from __future__ import annotations

import torch
from torch import nn

from abortable import EngineConfig
from ab_attn.backend import AbortAwareBackend


class DecoderLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, backend: AbortAwareBackend):
        super().__init__()
        self.layer_id, self.backend = layer_id, backend
        self.h, self.kvh, self.d = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.qkv = nn.Linear(cfg.hidden_size, (self.h + 2 * self.kvh) * self.d, bias=False)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)
        self.mlp = nn.Sequential(nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size), nn.SiLU(),
                                 nn.Linear(4 * cfg.hidden_size, cfg.hidden_size))

    def _qkv(self, h: torch.Tensor, out_loc: torch.Tensor) -> torch.Tensor:
        n = h.shape[0]
        q, k, v = self.qkv(self.norm(h)).split([self.h * self.d, self.kvh * self.d, self.kvh * self.d], -1)
        self.backend.write_kv(self.layer_id, k.view(n, self.kvh, self.d), v.view(n, self.kvh, self.d), out_loc)
        return q.view(n, self.h, self.d)

    def forward_decode(self, h: torch.Tensor, out_loc: torch.Tensor, bs: int) -> torch.Tensor:
        o = self.backend.forward_decode(self._qkv(h, out_loc), self.layer_id, bs)
        h = h + self.o_proj(o.reshape(h.shape[0], -1))
        return h + self.mlp(h)

    def forward_extend(self, h: torch.Tensor, out_loc: torch.Tensor) -> torch.Tensor:
        o = self.backend.forward_extend(self._qkv(h, out_loc), self.layer_id)
        h = h + self.o_proj(o.reshape(h.shape[0], -1))
        return h + self.mlp(h)


class AbortableDecoder(nn.Module):
    def __init__(self, cfg: EngineConfig, backend: AbortAwareBackend):
        super().__init__()
        self.backend = backend
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, input_ids: torch.Tensor, out_loc: torch.Tensor, bs: int) -> torch.Tensor:
        live = self.backend.live_mask[:bs]
        h = self.embed(input_ids)
        if not live.all():  # expect: FC101
            h = h.masked_fill(~live[:, None], 0.0)
        for layer in self.layers:
            h = layer.forward_decode(h, out_loc, bs)
        return self.lm_head(self.norm(h))

    def forward_extend(self, input_ids: torch.Tensor, out_loc: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_extend(h, out_loc)
        return self.lm_head(self.norm(h))
