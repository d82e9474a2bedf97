"""A Llama-shaped decoder used by both sides; the attention object is handed in per call."""
from __future__ import annotations

from typing import List

import torch
import torch.nn as nn
import torch.nn.functional as F
from flashinfer.rope import apply_rope_pos_ids

from pdkvx.config import ModelDims
from pdkvx.utils import rms_norm


class PDLayer(nn.Module):
    def __init__(self, dims: ModelDims, layer_id: int):
        super().__init__()
        self.layer_id, self.dims = layer_id, dims
        hidden = dims.hidden_size
        self.sizes = [dims.num_qo_heads * dims.head_dim] + [dims.num_kv_heads * dims.head_dim] * 2
        self.norms = nn.Parameter(torch.ones(2, hidden))
        self.qkv = nn.Linear(hidden, sum(self.sizes), bias=False)
        self.o_proj = nn.Linear(self.sizes[0], hidden, bias=False)
        self.gate_up, self.down = nn.Linear(hidden, 8 * hidden, bias=False), nn.Linear(4 * hidden, hidden, bias=False)

    def _qkv(self, h: torch.Tensor, positions: torch.Tensor):
        d = self.dims
        q, k, v = self.qkv(rms_norm(h, self.norms[0], d.rms_eps)).split(self.sizes, dim=-1)
        q, k = apply_rope_pos_ids(q.view(-1, d.num_qo_heads, d.head_dim), k.view(-1, d.num_kv_heads, d.head_dim), positions)
        return q, k, v.view(-1, d.num_kv_heads, d.head_dim)

    def _out(self, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        h = h + self.o_proj(o.reshape(o.shape[0], -1))
        gate, up = self.gate_up(rms_norm(h, self.norms[1], self.dims.rms_eps)).chunk(2, dim=-1)
        return h + self.down(F.silu(gate) * up)

    def decode(self, h: torch.Tensor, positions: torch.Tensor, attn, kv_cache: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(h, positions)
        attn.store_kv(k, v, kv_cache)
        return self._out(h, attn.forward_decode(self.layer_id, q, kv_cache))

    def prefill(self, h: torch.Tensor, positions: torch.Tensor, attn, kv_cache: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(h, positions)
        return self._out(h, attn.forward_prefill(self.layer_id, q, k, v, kv_cache))


class PDModel(nn.Module):
    def __init__(self, dims: ModelDims):
        super().__init__()
        self.dims = dims
        self.embed = nn.Embedding(dims.vocab_size, dims.hidden_size)
        self.layers = nn.ModuleList([PDLayer(dims, i) for i in range(dims.num_layers)])
        self.final_norm = nn.Parameter(torch.ones(dims.hidden_size))
        self.lm_head = nn.Linear(dims.hidden_size, dims.vocab_size, bias=False)

    def decode_forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn,
                       kv_cache: List[torch.Tensor]) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, kv_cache):
            h = layer.decode(h, positions, attn, kv)
        return self.lm_head(rms_norm(h, self.final_norm, self.dims.rms_eps))

    def prefill_forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn,
                        kv_cache: List[torch.Tensor], last_idx: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, kv_cache):
            h = layer.prefill(h, positions, attn, kv)
        return self.lm_head(rms_norm(h.index_select(0, last_idx), self.final_norm, self.dims.rms_eps))


def make_kv_cache(dims: ModelDims, num_pages: int, page_size: int, device: torch.device) -> List[torch.Tensor]:
    shape = (num_pages, 2, page_size, dims.num_kv_heads, dims.head_dim)
    return [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(dims.num_layers)]
