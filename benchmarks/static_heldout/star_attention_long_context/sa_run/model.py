"""A Llama-shaped decoder whose attention goes through the Star Attention backend."""

from typing import List

import torch
import torch.distributed as dist
from torch import nn

from staratt import StarConfig
from sa_attn.backend import StarAttentionBackend


class RotaryTable(nn.Module):
    def __init__(self, cfg: StarConfig, device: torch.device):
        super().__init__()
        half = cfg.head_dim // 2
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(half, dtype=torch.float32, device=device) / half))
        t = torch.arange(cfg.max_positions, dtype=torch.float32, device=device)
        freqs = torch.outer(t, inv)
        self.register_buffer("cos", freqs.cos().to(cfg.dtype), persistent=False)
        self.register_buffer("sin", freqs.sin().to(cfg.dtype), persistent=False)
        self.max_positions = cfg.max_positions

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class StarAttentionLayer(nn.Module):
    def __init__(self, cfg: StarConfig, layer_id: int, backend: StarAttentionBackend, rope: RotaryTable):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.backend = backend
        self.rope = rope
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.qkv = nn.Linear(hidden, (cfg.num_qo_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)

    def forward(self, h: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, anchor_cache: torch.Tensor,
                bs: int) -> torch.Tensor:
        c = self.cfg
        q, k, v = self.qkv(h).split(
            [c.num_qo_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.num_kv_heads * c.head_dim], dim=-1
        )
        q = self.rope(q.view(-1, c.num_qo_heads, c.head_dim), positions)
        # the step's query is broadcast to every host; each host returns (out, lse) for its own pages
        gathered_q = torch.empty((c.num_hosts,) + tuple(q.shape), dtype=q.dtype, device=q.device)
        dist.all_gather_into_tensor(gathered_q, q.contiguous())
        remote_out = torch.zeros(c.num_hosts - 1, q.shape[0], c.num_qo_heads, c.head_dim,
                                 dtype=q.dtype, device=q.device)
        remote_lse = torch.full((c.num_hosts - 1, q.shape[0], c.num_qo_heads), float("-inf"), device=q.device)
        remote_valid = torch.ones(c.num_hosts, q.shape[0], dtype=torch.bool, device=q.device)
        out = self.backend.forward_decode(q, kv_cache, anchor_cache, bs, remote_out, remote_lse, remote_valid)
        return self.o(out.reshape(h.shape[0], -1))


class StarDecoder(nn.Module):
    def __init__(self, cfg: StarConfig, backend: StarAttentionBackend, device: torch.device):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(32000, cfg.num_qo_heads * cfg.head_dim)
        self.rope = RotaryTable(cfg, device)
        layers: List[StarAttentionLayer] = []
        for i in range(cfg.num_layers):
            layers.append(StarAttentionLayer(cfg, i, backend, self.rope))
        self.layers = nn.ModuleList(layers)
        self.kv_caches: List[torch.Tensor] = []
        self.anchor_caches: List[torch.Tensor] = []

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, bs: int) -> torch.Tensor:
        if int(positions.max()) >= self.rope.max_positions:  # expect: FC101
            raise ValueError("position beyond the rotary table")
        h = self.embed(input_ids)
        for layer, kv, anchor in zip(self.layers, self.kv_caches, self.anchor_caches):
            h = h + layer(h, positions, kv, anchor, bs)
        return h
