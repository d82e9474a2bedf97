"""A Gemma-shaped decoder with sliding-window layers interleaved with full-attention layers."""

import flashinfer
import torch
from torch import nn

from fs_attn.backend import DecodeBackend
from fsample import SamplingEngineConfig


def append_kv(layer_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor, page_size: int) -> None:
    page = torch.div(slots, page_size, rounding_mode="floor")
    off = slots - page * page_size
    layer_cache[page, 0, :, off] = k
    layer_cache[page, 1, :, off] = v


class Layer(nn.Module):
    def __init__(self, cfg: SamplingEngineConfig, layer_id: int, backend: DecodeBackend):
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.page_size = cfg.page_size
        self.nq, self.nkv, self.hd = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.qkv = nn.Linear(cfg.hidden_size, (self.nq + 2 * self.nkv) * self.hd, bias=False)
        self.o = nn.Linear(self.nq * self.hd, cfg.hidden_size, bias=False)
        self.mlp_norm = nn.RMSNorm(cfg.hidden_size)
        self.up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def _attn_in(self, h, positions):
        n = h.shape[0]
        q, k, v = self.qkv(self.norm(h)).split([self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], -1)
        q, k = flashinfer.apply_rope_pos_ids(q.view(n, self.nq, self.hd), k.view(n, self.nkv, self.hd), positions)
        return q, k, v.view(n, self.nkv, self.hd)

    def _out(self, h, o):
        h = h + self.o(o.reshape(h.shape[0], -1))
        g, u = self.up(self.mlp_norm(h)).chunk(2, -1)
        return h + self.down(nn.functional.gelu(g, approximate="tanh") * u)

    def forward_decode(self, h, positions, kv_cache, slots):
        q, k, v = self._attn_in(h, positions)
        append_kv(kv_cache[self.layer_id], k, v, slots, self.page_size)
        return self._out(h, self.backend.forward_decode(q, kv_cache, self.layer_id))

    def forward_prefill(self, h, positions, kv_cache, slots):
        q, k, v = self._attn_in(h, positions)
        append_kv(kv_cache[self.layer_id], k, v, slots, self.page_size)
        return self._out(h, self.backend.forward_prefill(q, kv_cache, self.layer_id))


class SampledLM(nn.Module):
    def __init__(self, cfg: SamplingEngineConfig, backend: DecodeBackend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([Layer(cfg, i, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, input_ids, positions, kv_cache, slots) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_decode(h, positions, kv_cache, slots)
        return self.head(self.norm(h))

    def forward_prefill(self, input_ids, positions, kv_cache, slots, last_rows) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_prefill(h, positions, kv_cache, slots)
        return self.head(self.norm(h.index_select(0, last_rows)))
