from __future__ import annotations

import torch
from torch import nn

from drsched.config import SchedConfig
from drsched_rt.attention import ResidentAttnBackend


class ResidentAttention(nn.Module):
    def __init__(self, cfg: SchedConfig, layer_id: int, backend: ResidentAttnBackend):
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.num_qo_heads = cfg.num_qo_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        qkv_out = (cfg.num_qo_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, qkv_out, bias=False)
        self.o_proj = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def _qkv(self, h: torch.Tensor):
        qd = self.num_qo_heads * self.head_dim
        kd = self.num_kv_heads * self.head_dim
        q, k, v = self.qkv_proj(h).split([qd, kd, kd], dim=-1)
        q = q.view(-1, self.num_qo_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        return q, k, v

    def decode(self, h: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(h)
        self.backend.store_kv_decode(kv_cache, k, v)
        o = self.backend.forward_decode(q, kv_cache, self.layer_id)
        return self.o_proj(o.reshape(q.shape[0], -1))

    def prefill(self, h: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(h)
        self.backend.store_kv_prefill(kv_cache, k, v)
        o = self.backend.forward_prefill(q, kv_cache, self.layer_id)
        return self.o_proj(o.reshape(q.shape[0], -1))


class ResidentModel(nn.Module):
    def __init__(self, cfg: SchedConfig, backend: ResidentAttnBackend, device: torch.device):
        super().__init__()
        self.backend = backend
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.pos_embed = nn.Embedding(cfg.max_pages_per_req * cfg.page_size, cfg.hidden_size)
        self.layers = nn.ModuleList([ResidentAttention(cfg, i, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        shape = (cfg.num_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, bs: int) -> torch.Tensor:
        h = self.embed(input_ids) + self.pos_embed(positions)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = h + layer.decode(h, kv)
        self.backend.append_decode_slots(bs)
        return self.lm_head(self.norm(h))

    def forward_prefill(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids) + self.pos_embed(positions)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = h + layer.prefill(h, kv)
        return self.lm_head(self.norm(h))
