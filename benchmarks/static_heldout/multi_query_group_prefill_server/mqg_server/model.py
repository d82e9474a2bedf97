from typing import List

import torch
import torch.nn.functional as F
from torch import nn

from mqg import Chunk, ServerConfig
from mqg_attn.backend import DecodeRows, RaggedPrefillBackend


def write_kv(kv_cache: torch.Tensor, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor, page_size: int) -> None:
    page, slot = loc // page_size, loc % page_size
    kv_cache[page, 0, :, slot] = k  # HND: [num_pages, 2, kv_heads, page_size, head_dim]
    kv_cache[page, 1, :, slot] = v


class Layer(nn.Module):
    def __init__(self, cfg: ServerConfig, backend: RaggedPrefillBackend, device: torch.device):
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        d, hd = cfg.hidden_size, cfg.head_dim
        self.q_size, self.kv_size = cfg.num_heads * hd, cfg.num_kv_heads * hd
        self.norm = nn.RMSNorm(d, device=device, dtype=cfg.dtype)
        self.qkv = nn.Linear(d, self.q_size + 2 * self.kv_size, bias=False, device=device, dtype=cfg.dtype)
        self.o = nn.Linear(self.q_size, d, bias=False, device=device, dtype=cfg.dtype)
        self.up = nn.Linear(d, 2 * 4 * d, bias=False, device=device, dtype=cfg.dtype)
        self.down = nn.Linear(4 * d, d, bias=False, device=device, dtype=cfg.dtype)

    def _qkv(self, h: torch.Tensor):
        cfg = self.cfg
        q, k, v = self.qkv(self.norm(h)).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        kv_shape = (-1, cfg.num_kv_heads, cfg.head_dim)
        return q.view(-1, cfg.num_heads, cfg.head_dim), k.view(kv_shape), v.view(kv_shape)

    def _finish(self, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        h = h + self.o(o.reshape(h.shape[0], -1))
        gate, up = self.up(h).chunk(2, dim=-1)
        return h + self.down(F.silu(gate) * up)

    def prefill(self, h, kv_cache, loc, chunk: Chunk, kernel: str) -> torch.Tensor:
        q, k, v = self._qkv(h)
        write_kv(kv_cache, loc, k, v, self.cfg.page_size)
        return self._finish(h, self.backend.forward_chunk(q, k, v, kv_cache, chunk, kernel))

    def decode(self, h, kv_cache, loc, bs: int) -> torch.Tensor:
        q, k, v = self._qkv(h)
        write_kv(kv_cache, loc, k, v, self.cfg.page_size)
        return self._finish(h, self.backend.forward_decode(q, kv_cache, bs))

    def decode_eager(self, h, kv_cache, loc, rows: DecodeRows) -> torch.Tensor:
        q, k, v = self._qkv(h)
        write_kv(kv_cache, loc, k, v, self.cfg.page_size)
        return self._finish(h, self.backend.forward_decode_eager(q, kv_cache, rows))


class PrefillModel(nn.Module):
    def __init__(self, cfg: ServerConfig, backend: RaggedPrefillBackend, kv_caches: List[torch.Tensor], device):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size, device=device, dtype=cfg.dtype)
        self.layers = nn.ModuleList([Layer(cfg, backend, device) for _ in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size, device=device, dtype=cfg.dtype)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, device=device, dtype=cfg.dtype)
        self.kv_caches = kv_caches

    def forward_prefill(self, ids, loc, chunk: Chunk, kernel: str) -> torch.Tensor:
        h = self.embed(ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer.prefill(h, kv, loc, chunk, kernel)
        return self.norm(h)

    def forward_decode(self, ids, loc, bs: int) -> torch.Tensor:
        h = self.embed(ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer.decode(h, kv, loc, bs)
        return self.lm_head(self.norm(h))

    def forward_decode_eager(self, ids, loc, rows: DecodeRows) -> torch.Tensor:
        h = self.embed(ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer.decode_eager(h, kv, loc, rows)
        return self.lm_head(self.norm(h))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(h)
