from typing import List, Union

import torch
from torch import nn

from mpp import BackendConfig
from mpp_attn.gqa import GqaDecodeBackend
from mpp_attn.mla import MlaDecodeBackend

DecodeBackend = Union[GqaDecodeBackend, MlaDecodeBackend]


class Block(nn.Module):
    def __init__(self, cfg: BackendConfig, backend: DecodeBackend, device: torch.device):
        super().__init__()
        h = cfg.hidden_size
        self.norm = nn.RMSNorm(h, device=device, dtype=cfg.dtype)
        self.q_proj = nn.Linear(h, backend.q_dim, bias=False, device=device, dtype=cfg.dtype)
        self.kv_proj = nn.Linear(h, backend.kv_dim, bias=False, device=device, dtype=cfg.dtype)
        self.o_proj = nn.Linear(backend.out_dim, h, bias=False, device=device, dtype=cfg.dtype)
        self.mlp = nn.Sequential(
            nn.Linear(h, 4 * h, bias=False, device=device, dtype=cfg.dtype),
            nn.SiLU(),
            nn.Linear(4 * h, h, bias=False, device=device, dtype=cfg.dtype),
        )
        self.backend = backend

    def forward(self, h: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        x = self.norm(h)
        self.backend.store_kv(self.kv_proj(x), kv_cache, bs)
        o = self.backend.forward_decode(self.q_proj(x), kv_cache, bs)
        h = h + self.o_proj(o.reshape(h.shape[0], -1))
        return h + self.mlp(h)


class DecodeModel(nn.Module):
    def __init__(self, cfg: BackendConfig, backend: DecodeBackend, kv_caches: List[torch.Tensor], device):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size, device=device, dtype=cfg.dtype)
        self.blocks = nn.ModuleList([Block(cfg, backend, device) for _ in range(cfg.num_layers)])
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, device=device, dtype=cfg.dtype)
        self.kv_caches = kv_caches

    def forward_decode(self, input_ids: torch.Tensor, bs: int) -> torch.Tensor:
        h = self.embed(input_ids)
        for blk, kv in zip(self.blocks, self.kv_caches):
            h = blk(h, kv, bs)
        return self.head(h)
