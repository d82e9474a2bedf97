"""Llama-style decoder with decode and tool-output resume entry points."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from agentsrv.settings import AgentSettings
from agentsrv_core.attention import AgentAttention


class AgentBlock(nn.Module):
    def __init__(self, s: AgentSettings, layer_id: int, attn: AgentAttention):
        super().__init__()
        self.layer_id = layer_id
        self.attn = attn
        self.nq, self.nkv, self.hd = s.num_qo_heads, s.num_kv_heads, s.head_dim
        self.page_size = s.page_size
        self.norm = nn.RMSNorm(s.hidden_size)
        self.qkv = nn.Linear(s.hidden_size, (self.nq + 2 * self.nkv) * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nq * self.hd, s.hidden_size, bias=False)
        self.mlp_norm = nn.RMSNorm(s.hidden_size)
        self.gate_up = nn.Linear(s.hidden_size, 2 * 14336, bias=False)
        self.down = nn.Linear(14336, s.hidden_size, bias=False)

    def _project(self, h: torch.Tensor, slot_mapping: torch.Tensor):
        n = h.shape[0]
        q, k, v = self.qkv(self.norm(h)).split([self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        kv = self.attn.kv_cache[self.layer_id]
        kv[slot_mapping // self.page_size, 0, slot_mapping % self.page_size] = k.view(n, self.nkv, self.hd)
        kv[slot_mapping // self.page_size, 1, slot_mapping % self.page_size] = v.view(n, self.nkv, self.hd)
        return q.view(n, self.nq, self.hd)

    def _mlp(self, h: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(self.mlp_norm(h)).chunk(2, dim=-1)
        return h + self.down(F.silu(gate) * up)

    def forward_decode(self, h: torch.Tensor, slot_mapping: torch.Tensor, bs: int) -> torch.Tensor:
        q = self._project(h, slot_mapping)
        o = self.attn.decode(q, self.layer_id, bs)
        return self._mlp(h + self.o_proj(o.reshape(h.shape[0], -1)))

    def forward_resume(self, h: torch.Tensor, slot_mapping: torch.Tensor, n: int) -> torch.Tensor:
        q = self._project(h, slot_mapping)
        o = self.attn.prefill_resume(q, self.layer_id, n)
        return self._mlp(h + self.o_proj(o.reshape(h.shape[0], -1)))


class AgentLM(nn.Module):
    def __init__(self, s: AgentSettings, attn: AgentAttention):
        super().__init__()
        self.embed = nn.Embedding(s.vocab_size, s.hidden_size)
        self.layers = nn.ModuleList([AgentBlock(s, i, attn) for i in range(s.num_layers)])
        self.norm = nn.RMSNorm(s.hidden_size)
        self.lm_head = nn.Linear(s.hidden_size, s.vocab_size, bias=False)

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor, bs: int) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_decode(h, slot_mapping, bs)
        return self.lm_head(self.norm(h))

    def forward_resume(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor, n: int, last_rows: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_resume(h, slot_mapping, n)
        return self.lm_head(self.norm(h.index_select(0, last_rows)))
