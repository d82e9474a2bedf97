"""A Llama-shaped model whose attention is sequence-parallel: tokens arrive sharded over the group, the
all-to-all trades the token shard for a head shard, attention runs, and a second all-to-all trades back."""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ulysses.comm import UlyssesComm
from ulysses.config import UlyssesConfig
from ulysses_rt.attention import UlyssesAttention
from ulysses_rt.kv import HeadShardedKV


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    half = x.shape[-1] // 2
    inv = theta ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    ang = positions.float()[:, None, None] * inv
    a, b = x[..., :half].float(), x[..., half:].float()
    return torch.cat([a * ang.cos() - b * ang.sin(), a * ang.sin() + b * ang.cos()], dim=-1).type_as(x)


class SPLayer(nn.Module):
    def __init__(self, cfg: UlyssesConfig, layer_id: int, comm: UlyssesComm, attn: UlyssesAttention, kv: HeadShardedKV):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.comm = comm
        self.attn = attn
        self.kv = kv
        q, kvd = cfg.num_q_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.splits = (q, kvd, kvd)
        self.qkv = nn.Linear(cfg.hidden_size, q + 2 * kvd, bias=False)
        self.o = nn.Linear(q, cfg.hidden_size, bias=False)
        self.n1 = nn.RMSNorm(cfg.hidden_size)
        self.n2 = nn.RMSNorm(cfg.hidden_size)
        self.up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def _scatter(self, h: torch.Tensor, positions: torch.Tensor, out_loc: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c = self.cfg
        q, k, v = self.qkv(self.n1(h)).split(self.splits, dim=-1)
        q = rope(q.view(-1, c.num_q_heads, c.head_dim), positions, c.rope_theta)
        k = rope(k.view(-1, c.num_kv_heads, c.head_dim), positions, c.rope_theta)
        v = v.view(-1, c.num_kv_heads, c.head_dim)
        # sequence shard -> head shard
        q, k, v = self.comm.seq_to_heads(q), self.comm.seq_to_heads(k), self.comm.seq_to_heads(v)
        self.kv.store(self.layer_id, k, v, out_loc)
        return q, k, v

    def _gather(self, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        o = self.comm.heads_to_seq(o)
        h = h + self.o(o.flatten(1))
        g, u = self.up(self.n2(h)).chunk(2, dim=-1)
        return h + self.down(F.silu(g) * u)

    def forward_decode(self, h: torch.Tensor, positions: torch.Tensor, out_loc: torch.Tensor) -> torch.Tensor:
        q, _, _ = self._scatter(h, positions, out_loc)
        return self._gather(h, self.attn.forward_decode(q, self.layer_id))

    def forward_prefill(self, h: torch.Tensor, positions: torch.Tensor, out_loc: torch.Tensor) -> torch.Tensor:
        q, k, v = self._scatter(h, positions, out_loc)
        return self._gather(h, self.attn.forward_prefill(q, k, v))


class UlyssesModel(nn.Module):
    def __init__(self, cfg: UlyssesConfig, comm: UlyssesComm, attn: UlyssesAttention, kv: HeadShardedKV):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([SPLayer(cfg, i, comm, attn, kv) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, out_loc: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_decode(h, positions, out_loc)
        return self.lm_head(self.norm(h))

    def forward_prefill(self, input_ids: torch.Tensor, positions: torch.Tensor, out_loc: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_prefill(h, positions, out_loc)
        return self.lm_head(self.norm(h))
