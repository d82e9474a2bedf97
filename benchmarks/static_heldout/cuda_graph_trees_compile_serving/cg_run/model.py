from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from cgt import ServingConfig
from cg_attn.backend import GraphTreeAttnBackend


@dataclass
class ForwardCtx:
    bucket: Optional[int]
    num_reqs: int
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    max_seq_len: int


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_pos: int, device: torch.device, base: float = 10000.0):
        super().__init__()
        inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
        freqs = torch.outer(torch.arange(max_pos, device=device).float(), inv)
        self.register_buffer("cos_cache", freqs.cos(), persistent=False)
        self.register_buffer("sin_cache", freqs.sin(), persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        # only the rows up to the longest position are gathered
        hi = int(positions.max()) + 1  # expect: FC101
        cos = self.cos_cache[:hi][positions].unsqueeze(1)
        sin = self.sin_cache[:hi][positions].unsqueeze(1)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ServingConfig, layer_id: int, backend: GraphTreeAttnBackend, rotary: RotaryEmbedding):
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.rotary = rotary
        self.nq, self.nkv, self.hd = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        hidden = cfg.hidden_size
        self.qkv = nn.Linear(hidden, (self.nq + 2 * self.nkv) * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nq * self.hd, hidden, bias=False)
        self.mlp = nn.Sequential(nn.RMSNorm(hidden), nn.Linear(hidden, cfg.intermediate_size, bias=False),
                                 nn.SiLU(), nn.Linear(cfg.intermediate_size, hidden, bias=False))
        self.norm = nn.RMSNorm(hidden)

    def _project(self, h: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, ctx: ForwardCtx):
        q, k, v = self.qkv(self.norm(h)).split([self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q, k = self.rotary(positions, q.view(-1, self.nq, self.hd), k.view(-1, self.nkv, self.hd))
        page_idx, in_page = ctx.slot_mapping // kv_cache.shape[2], ctx.slot_mapping % kv_cache.shape[2]
        kv_cache[page_idx, 0, in_page] = k
        kv_cache[page_idx, 1, in_page] = v.view(-1, self.nkv, self.hd)
        return q

    def _finish(self, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        h = h + self.o_proj(attn.reshape(-1, self.nq * self.hd))
        return h + self.mlp(h)

    def forward(self, h: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, ctx: ForwardCtx):
        q = self._project(h, positions, kv_cache, ctx)
        return self._finish(h, self.backend.decode_attention(q, kv_cache, self.layer_id, ctx))

    def forward_prefill(self, h: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, ctx: ForwardCtx):
        q = self._project(h, positions, kv_cache, ctx)
        return self._finish(h, self.backend.prefill_attention(q, kv_cache))


class DecoderModel(nn.Module):
    def __init__(self, cfg: ServingConfig, backend: GraphTreeAttnBackend):
        super().__init__()
        device = torch.device(cfg.device)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_seq_len, device)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i, backend, self.rotary) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        shape = (cfg.max_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=cfg.dtype, device=device) for _ in range(cfg.num_layers)]

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardCtx) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer(h, positions, kv, ctx)
        return self.lm_head(self.norm(h))

    def forward_prefill(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardCtx) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer.forward_prefill(h, positions, kv, ctx)
        return self.lm_head(self.norm(h[-1:]))
