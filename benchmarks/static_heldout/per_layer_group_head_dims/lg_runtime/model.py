"""A Gemma-shaped decoder: five sliding-window layers for each global layer."""
from __future__ import annotations

from typing import List

import torch
from torch import nn

from lg_runtime.metadata import StepMetadata
from lgroups.kv_pool import GroupKVPool
from lgroups.spec import LayerGroupSpec, ModelGroupsConfig


def rope(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    d = x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ang = positions.float()[:, None] * inv
    c, s = ang.cos()[:, None], ang.sin()[:, None]
    a, b = x[..., : d // 2].float(), x[..., d // 2 :].float()
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1).type_as(x)


class _GroupAttentionBase(nn.Module):
    rope_base = 10000.0

    def __init__(self, layer_id: int, group_id: int, spec: LayerGroupSpec, hidden: int, pool: GroupKVPool):
        super().__init__()
        self.layer_id = layer_id
        self.group_id = group_id
        self.h, self.kvh, self.d = spec.num_qo_heads, spec.num_kv_heads, spec.head_dim
        self.qkv = nn.Linear(hidden, (self.h + 2 * self.kvh) * self.d, bias=False)
        self.o_proj = nn.Linear(self.h * self.d, hidden, bias=False)
        self.q_norm = nn.RMSNorm(self.d)
        self.k_norm = nn.RMSNorm(self.d)
        self.pool = pool

    def _project(self, x: torch.Tensor, positions: torch.Tensor):
        q, k, v = self.qkv(x).split([self.h * self.d, self.kvh * self.d, self.kvh * self.d], dim=-1)
        q = rope(self.q_norm(q.view(-1, self.h, self.d)), positions, self.rope_base)
        k = rope(self.k_norm(k.view(-1, self.kvh, self.d)), positions, self.rope_base)
        return q, k, v.view(-1, self.kvh, self.d)


class LocalAttention(_GroupAttentionBase):
    def forward(self, x: torch.Tensor, positions: torch.Tensor, meta: StepMetadata) -> torch.Tensor:
        q, k, v = self._project(x, positions)
        gmeta = meta.groups[self.group_id]
        kv = self.pool.write(self.layer_id, k, v, gmeta.slot_mapping)
        o = gmeta.wrapper.run(q, kv)  # ok: FC108
        return self.o_proj(o.reshape(x.shape[0], -1))


class GlobalAttention(_GroupAttentionBase):
    rope_base = 1000000.0

    def forward(self, x: torch.Tensor, positions: torch.Tensor, meta: StepMetadata) -> torch.Tensor:
        q, k, v = self._project(x, positions)
        gm = meta.global_meta
        kv = self.pool.write(self.layer_id, k, v, gm.slot_mapping)
        o = gm.wrapper.run(q, kv)  # expect: FC108
        return self.o_proj(o.reshape(x.shape[0], -1))


class DecoderLayer(nn.Module):
    def __init__(self, layer_id: int, cfg: ModelGroupsConfig, pools: List[GroupKVPool]):
        super().__init__()
        g = cfg.group_of(layer_id)
        spec = cfg.groups[g]
        if spec.is_local:
            self.attn = LocalAttention(layer_id, g, spec, cfg.hidden_size, pools[g])
        else:
            self.attn = GlobalAttention(layer_id, g, spec, cfg.hidden_size, pools[g])
        self.pre_norm = nn.RMSNorm(cfg.hidden_size)
        self.post_norm = nn.RMSNorm(cfg.hidden_size)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * 4 * cfg.hidden_size, bias=False)
        self.down = nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False)

    def forward(self, h: torch.Tensor, positions: torch.Tensor, meta: StepMetadata) -> torch.Tensor:
        h = h + self.attn(self.pre_norm(h), positions, meta)
        g, u = self.gate_up(self.post_norm(h)).chunk(2, dim=-1)
        return h + self.down(nn.functional.gelu(g, approximate="tanh") * u)


class GroupedModel(nn.Module):
    def __init__(self, cfg: ModelGroupsConfig, pools: List[GroupKVPool]):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(i, cfg, pools) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.scale = cfg.hidden_size ** 0.5

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: StepMetadata) -> torch.Tensor:
        h = self.embed(input_ids) * self.scale
        for layer in self.layers:
            h = layer(h, positions, meta)
        h = self.norm(h)
        return h @ self.embed.weight.t()
