"""A small Qwen-shaped language model whose attention goes through the backend."""

import flashinfer
import torch
from torch import nn

from lm_attn.backend import VLMAttentionBackend
from vlm import VLMConfig


def write_kv(layer_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor, page_size: int) -> None:
    # HND pages: [num_pages, 2, num_kv_heads, page_size, head_dim]
    page = torch.div(slots, page_size, rounding_mode="floor")
    off = slots - page * page_size
    layer_cache[page, 0, :, off] = k
    layer_cache[page, 1, :, off] = v


class DecoderLayer(nn.Module):
    def __init__(self, cfg: VLMConfig, layer_id: int, backend: VLMAttentionBackend):
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.page_size = cfg.page_size
        self.nq, self.nkv, self.hd = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.norm1 = nn.RMSNorm(cfg.hidden_size)
        self.qkv = nn.Linear(cfg.hidden_size, (self.nq + 2 * self.nkv) * self.hd, bias=True)
        self.o = nn.Linear(self.nq * self.hd, cfg.hidden_size, bias=False)
        self.norm2 = nn.RMSNorm(cfg.hidden_size)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def _qkv(self, h: torch.Tensor, positions: torch.Tensor):
        n = h.shape[0]
        q, k, v = self.qkv(h).split([self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q, k = flashinfer.apply_rope_pos_ids(
            q.view(n, self.nq, self.hd), k.view(n, self.nkv, self.hd), positions, rope_theta=1e6
        )
        return q, k, v.view(n, self.nkv, self.hd)

    def _mlp(self, h: torch.Tensor) -> torch.Tensor:
        g, u = self.gate_up(self.norm2(h)).chunk(2, dim=-1)
        return h + self.down(nn.functional.silu(g) * u)

    def forward_decode(self, h, positions, kv_cache, slots):
        q, k, v = self._qkv(self.norm1(h), positions)
        write_kv(kv_cache[self.layer_id], k, v, slots, self.page_size)
        o = self.backend.forward_decode(q, kv_cache, self.layer_id)
        return self._mlp(h + self.o(o.reshape(h.shape[0], -1)))

    def forward_prefill(self, h, positions, kv_cache, slots):
        q, k, v = self._qkv(self.norm1(h), positions)
        write_kv(kv_cache[self.layer_id], k, v, slots, self.page_size)
        o = self.backend.forward_prefill(q, kv_cache, self.layer_id)
        return self._mlp(h + self.o(o.reshape(h.shape[0], -1)))


class VLMLanguageModel(nn.Module):
    def __init__(self, cfg: VLMConfig, backend: VLMAttentionBackend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, input_ids, positions, kv_cache, slots) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_decode(h, positions, kv_cache, slots)
        return self.lm_head(self.norm(h))

    def forward_prefill(self, inputs_embeds, positions, kv_cache, slots, last_rows) -> torch.Tensor:
        h = inputs_embeds
        for layer in self.layers:
            h = layer.forward_prefill(h, positions, kv_cache, slots)
        return self.lm_head(self.norm(h.index_select(0, last_rows)))
