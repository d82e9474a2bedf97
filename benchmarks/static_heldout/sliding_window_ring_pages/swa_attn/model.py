from typing import List

import torch
from torch import nn

from swaring import SWAConfig
from swa_attn.backend import SlidingWindowBackend
from swa_attn.metadata import WindowStepMeta


class SWALayer(nn.Module):
    def __init__(self, cfg: SWAConfig, layer_id: int, backend: SlidingWindowBackend):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.backend = backend
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_qo_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.mlp = nn.Sequential(nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size), nn.GELU(),
                                 nn.Linear(4 * cfg.hidden_size, cfg.hidden_size))

    def _q(self, h: torch.Tensor) -> torch.Tensor:
        return self.q_proj(self.norm(h)).view(-1, self.cfg.num_qo_heads, self.cfg.head_dim)

    def forward(self, h: torch.Tensor, kv: torch.Tensor, meta: WindowStepMeta, padded_bs: int) -> torch.Tensor:
        attn = self.backend.forward_decode(self.layer_id, self._q(h), kv, meta, padded_bs)
        h = h + self.o_proj(attn.reshape(h.shape[0], -1))
        return h + self.mlp(h)

    def prefill(self, h: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        attn = self.backend.forward_prefill(self.layer_id, self._q(h), kv)
        h = h + self.o_proj(attn.reshape(h.shape[0], -1))
        return h + self.mlp(h)


class SWAModel(nn.Module):
    def __init__(self, cfg: SWAConfig, backend: SlidingWindowBackend):
        super().__init__()
        self.embed = nn.Embedding(256000, cfg.hidden_size)
        self.layers = nn.ModuleList([SWALayer(cfg, i, backend) for i in range(cfg.num_layers)])
        self.head = nn.Linear(cfg.hidden_size, 256000, bias=False)

    def decode(self, ids: torch.Tensor, kv_caches: List[torch.Tensor], meta: WindowStepMeta,
               padded_bs: int) -> torch.Tensor:
        h = self.embed(ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer(h, kv, meta, padded_bs)
        return self.head(h)

    def prefill(self, ids: torch.Tensor, kv_caches: List[torch.Tensor]) -> torch.Tensor:
        h = self.embed(ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer.prefill(h, kv)
        return self.head(h)
