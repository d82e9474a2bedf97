"""A Llama-shaped decoder with a paged KV pool; attention goes through the backend."""

from __future__ import annotations

from typing import List, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from compatserve import compat
from compatserve.attention.flashinfer_backend import FlashInferAttnBackend
from compatserve.config import EngineConfig
from compatserve.forward_batch import ForwardBatch


class KVPool:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.num_pages = cfg.num_pages
        self.page_size = cfg.page_size
        shape = (cfg.num_pages, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.k_buffers: List[torch.Tensor] = [
            torch.zeros(shape, dtype=cfg.dtype, device=device) for _ in range(cfg.num_layers)
        ]
        self.v_buffers: List[torch.Tensor] = [
            torch.zeros(shape, dtype=cfg.dtype, device=device) for _ in range(cfg.num_layers)
        ]

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        kb = self.k_buffers[layer_id].view(-1, *self.k_buffers[layer_id].shape[2:])
        vb = self.v_buffers[layer_id].view(-1, *self.v_buffers[layer_id].shape[2:])
        kb[loc] = k.view(-1, *kb.shape[1:])
        vb[loc] = v.view(-1, *vb.shape[1:])

    def get_kv_buffer(self, layer_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffers[layer_id], self.v_buffers[layer_id]


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_pos: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        t = torch.arange(max_pos, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        self.register_buffer("cos_sin_cache", torch.cat([freqs.cos(), freqs.sin()], dim=-1), persistent=False)
        self.head_dim = head_dim

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        if compat.apply_rope_pos_ids is not None:
            # FlashInfer's kernel; positions must have compat.ROPE_POS_DTYPE
            q = q.view(q.shape[0], -1, self.head_dim)
            k = k.view(k.shape[0], -1, self.head_dim)
            return compat.apply_rope_pos_ids(q, k, positions)
        cos, sin = self.cos_sin_cache[positions.long()].chunk(2, dim=-1)
        return _rotate(q, cos, sin, self.head_dim), _rotate(k, cos, sin, self.head_dim)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int) -> torch.Tensor:
    x = x.view(x.shape[0], -1, head_dim)
    x1, x2 = x[..., : head_dim // 2], x[..., head_dim // 2 :]
    cos, sin = cos.unsqueeze(1).to(x.dtype), sin.unsqueeze(1).to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class RadixAttention(nn.Module):
    def __init__(self, layer_id: int, cfg: EngineConfig, backend: FlashInferAttnBackend):
        super().__init__()
        self.layer_id = layer_id
        self.num_qo_heads = cfg.num_qo_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.scaling = cfg.head_dim ** -0.5
        self.logit_cap = cfg.logit_cap
        self.sliding_window = cfg.sliding_window if layer_id in cfg.window_layers else -1
        self.backend = backend

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        if fb.forward_mode.is_decode():
            return self.backend.forward_decode(q, k, v, self, fb)
        return self.backend.forward_extend(q, k, v, self, fb)

    def forward_decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        return self.backend.forward_decode(q, k, v, self, fb)


class DecoderLayer(nn.Module):
    def __init__(self, layer_id: int, cfg: EngineConfig, backend: FlashInferAttnBackend):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.q_size = cfg.num_qo_heads * d
        self.kv_size = cfg.num_kv_heads * d
        self.input_norm = nn.RMSNorm(h)
        self.qkv_proj = nn.Linear(h, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, h, bias=False)
        self.post_norm = nn.RMSNorm(h)
        self.gate_up = nn.Linear(h, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, h, bias=False)
        self.rotary = RotaryEmbedding(d, cfg.max_context_len, cfg.rope_theta)
        self.attn = RadixAttention(layer_id, cfg, backend)

    def _qkv(self, h: torch.Tensor, positions: torch.Tensor):
        q, k, v = self.qkv_proj(self.input_norm(h)).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary(positions, q, k)
        return q.reshape(h.shape[0], -1), k.reshape(h.shape[0], -1), v

    def _mlp(self, h: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        h = h + self.o_proj(attn_out)
        gate, up = self.gate_up(self.post_norm(h)).chunk(2, dim=-1)
        return h + self.down(F.silu(gate) * up)

    def forward(self, h: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, k, v = self._qkv(h, positions)
        return self._mlp(h, self.attn(q, k, v, fb))

    def forward_decode(self, h: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, k, v = self._qkv(h, positions)
        return self._mlp(h, self.attn.forward_decode(q, k, v, fb))


class CompatLM(nn.Module):
    def __init__(self, cfg: EngineConfig, backend: FlashInferAttnBackend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(i, cfg, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, positions, fb)
        if not fb.forward_mode.is_decode():
            h = h[fb.qo_indptr[1:].long() - 1]  # last token of each request
        return self.lm_head(self.norm(h))

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """Decode-only entry point; this is what the CUDA graphs capture."""
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_decode(h, positions, fb)
        return self.lm_head(self.norm(h))
