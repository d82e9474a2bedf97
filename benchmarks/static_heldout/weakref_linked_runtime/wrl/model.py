"""A Llama-style decoder. Layers reach the attention backend through a ``weakref.proxy`` the model
hands down, so a model kept alive by a stray reference (a profiler, a test) does not pin the
backend's wrappers and workspaces."""

from __future__ import annotations

import weakref

import torch
import torch.nn as nn
import torch.nn.functional as F

from wrl.attention import FlashInferAttnBackend
from wrl.batch import ForwardBatch
from wrl.config import EngineConfig


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    head_dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=x.device, dtype=torch.float32) / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    cos, sin = freqs.cos()[:, None, :], freqs.sin()[:, None, :]
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class AttentionLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, attn_backend):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.q_size = cfg.num_qo_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.input_norm = nn.RMSNorm(cfg.hidden_size)
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.post_norm = nn.RMSNorm(cfg.hidden_size)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * 4 * cfg.hidden_size, bias=False)
        self.down = nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.attn = attn_backend  # a weakref.proxy (see DecoderModel)

    def _qkv(self, h: torch.Tensor, positions: torch.Tensor):
        qkv = self.qkv_proj(self.input_norm(h))
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = apply_rope(q.view(-1, self.cfg.num_qo_heads, self.cfg.head_dim), positions, self.cfg.rope_theta)
        k = apply_rope(k.view(-1, self.cfg.num_kv_heads, self.cfg.head_dim), positions, self.cfg.rope_theta)
        return q, k, v.view(-1, self.cfg.num_kv_heads, self.cfg.head_dim)

    def _mlp(self, h: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(self.post_norm(h)).chunk(2, dim=-1)
        return h + self.down(F.silu(gate) * up)

    def decode(self, h: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, k, v = self._qkv(h, positions)
        o = self.attn.forward_decode(q, k, v, self.layer_id, fb)
        return self._mlp(h + self.o_proj(o.reshape(-1, self.q_size)))

    def extend(self, h: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, k, v = self._qkv(h, positions)
        o = self.attn.forward_extend(q, k, v, self.layer_id, fb)
        return self._mlp(h + self.o_proj(o.reshape(-1, self.q_size)))


class DecoderModel(nn.Module):
    def __init__(self, cfg: EngineConfig, attn_backend: FlashInferAttnBackend):
        super().__init__()
        backend = weakref.proxy(attn_backend)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([AttentionLayer(cfg, i, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def decode_step(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.decode(h, positions, fb)
        return self.lm_head(self.norm(h))

    def prefill_step(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.extend(h, positions, fb)
        h = h[fb.logits_indices]
        return self.lm_head(self.norm(h))
