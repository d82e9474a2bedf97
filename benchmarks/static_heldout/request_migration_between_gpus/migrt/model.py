"""The model, replicated on both GPUs."""

from __future__ import annotations

import torch
from flashinfer.rope import apply_rope_pos_ids
from torch import nn

from gpumig.limits import MigrationLimits
from gpumig.page_table import KVPool
from migrt.attention import DeviceAttention


class Layer(nn.Module):
    def __init__(self, limits: MigrationLimits, layer_id: int, attn: DeviceAttention, pool: KVPool) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.attn = attn
        self.pool = pool
        self.hq, self.hkv, self.d = limits.num_qo_heads, limits.num_kv_heads, limits.head_dim
        self.n1 = nn.RMSNorm(limits.hidden_size)
        self.n2 = nn.RMSNorm(limits.hidden_size)
        self.qkv = nn.Linear(limits.hidden_size, (self.hq + 2 * self.hkv) * self.d, bias=False)
        self.o = nn.Linear(self.hq * self.d, limits.hidden_size, bias=False)
        self.w13 = nn.Linear(limits.hidden_size, 2 * 3 * limits.hidden_size, bias=False)
        self.w2 = nn.Linear(3 * limits.hidden_size, limits.hidden_size, bias=False)

    def _qkv(self, h: torch.Tensor, positions: torch.Tensor, out_loc: torch.Tensor):
        q, k, v = self.qkv(self.n1(h)).split([self.hq * self.d, self.hkv * self.d, self.hkv * self.d], dim=-1)
        q, k = apply_rope_pos_ids(q.view(-1, self.hq, self.d), k.view(-1, self.hkv, self.d), positions)
        v = v.view(-1, self.hkv, self.d)
        self.pool.write(self.layer_id, k, v, out_loc)
        return q, k, v

    def _rest(self, h: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        h = h + self.o(a.reshape(-1, self.hq * self.d))
        x1, x3 = self.w13(self.n2(h)).chunk(2, dim=-1)
        return h + self.w2(torch.nn.functional.silu(x1) * x3)

    def forward_decode(self, h, positions, out_loc, bs: int) -> torch.Tensor:
        q, _, _ = self._qkv(h, positions, out_loc)
        return self._rest(h, self.attn.forward_decode(self.layer_id, q, bs))

    def forward_prefill(self, h, positions, out_loc) -> torch.Tensor:
        q, k, v = self._qkv(h, positions, out_loc)
        return self._rest(h, self.attn.forward_recompute(q, k, v))


class ShardLM(nn.Module):
    def __init__(self, limits: MigrationLimits, attn: DeviceAttention, pool: KVPool) -> None:
        super().__init__()
        self.embed = nn.Embedding(limits.vocab_size, limits.hidden_size)
        self.layers = nn.ModuleList([Layer(limits, i, attn, pool) for i in range(limits.num_layers)])
        self.norm = nn.RMSNorm(limits.hidden_size)
        self.head = nn.Linear(limits.hidden_size, limits.vocab_size, bias=False)

    def decode(self, input_ids, positions, out_loc, bs: int) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_decode(h, positions, out_loc, bs)
        return self.head(self.norm(h))

    def prefill(self, input_ids, positions, out_loc) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_prefill(h, positions, out_loc)
        return self.head(self.norm(h[-1:]))
