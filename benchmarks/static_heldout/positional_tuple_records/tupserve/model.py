"""A Llama-style decoder whose layers take the step record instead of a metadata object."""

from __future__ import annotations

import torch
from flashinfer.activation import silu_and_mul
from flashinfer.norm import rmsnorm
from flashinfer.rope import apply_rope_pos_ids
from torch import nn

from .attention.flashinfer_backend import FlashInferTupleBackend
from .config import EngineConfig
from .slots import DEV, MODE, POSITIONS, QO_INDPTR


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rmsnorm(x, self.weight, self.eps)


class TupleAttention(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, backend: FlashInferTupleBackend):
        super().__init__()
        self.layer_id = layer_id
        self.num_qo_heads = cfg.num_qo_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.rope_theta = cfg.rope_theta
        q_size = cfg.num_qo_heads * cfg.head_dim
        kv_size = cfg.num_kv_heads * cfg.head_dim
        self.split = (q_size, kv_size, kv_size)
        self.qkv_proj = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=False)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)
        self.backend = backend

    def _qkv(self, h: torch.Tensor, positions: torch.Tensor):
        q, k, v = self.qkv_proj(h).split(self.split, dim=-1)
        q = q.view(-1, self.num_qo_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        q, k = apply_rope_pos_ids(q, k, positions, rope_theta=self.rope_theta)
        return q, k, v

    def forward(self, h: torch.Tensor, meta: tuple) -> torch.Tensor:
        q, k, v = self._qkv(h, meta[POSITIONS])
        if meta[MODE] == "decode":
            o = self.backend.forward_decode(q, k, v, self.layer_id, meta)
        else:
            o = self.backend.forward_extend(q, k, v, self.layer_id, meta)
        return self.o_proj(o.reshape(h.shape[0], -1))

    def decode(self, h: torch.Tensor, meta: tuple) -> torch.Tensor:
        """Decode-only entry used by the graph runner (one token per row)."""
        q, k, v = self._qkv(h, meta[POSITIONS])
        o = self.backend.forward_decode(q, k, v, self.layer_id, meta)
        return self.o_proj(o.reshape(h.shape[0], -1))


class TupleDecoderLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, backend: FlashInferTupleBackend):
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = TupleAttention(cfg, layer_id, backend)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def _mlp(self, h: torch.Tensor) -> torch.Tensor:
        return self.down(silu_and_mul(self.gate_up(h)))

    def forward(self, h: torch.Tensor, meta: tuple) -> torch.Tensor:
        h = h + self.attn(self.input_norm(h), meta)
        return h + self._mlp(self.post_norm(h))

    def decode(self, h: torch.Tensor, meta: tuple) -> torch.Tensor:
        h = h + self.attn.decode(self.input_norm(h), meta)
        return h + self._mlp(self.post_norm(h))


class TupleLM(nn.Module):
    def __init__(self, cfg: EngineConfig, backend: FlashInferTupleBackend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(TupleDecoderLayer(cfg, i, backend) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, meta: tuple) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, meta)
        if meta[MODE] != "decode":
            last_idx = meta[QO_INDPTR][DEV][1:] - 1
            h = h[last_idx]  # ok: FC101
        return self.lm_head(self.norm(h))

    def decode(self, input_ids: torch.Tensor, meta: tuple) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.decode(h, meta)
        return self.lm_head(self.norm(h))
