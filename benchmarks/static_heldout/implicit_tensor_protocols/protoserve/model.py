"""A Llama-style decoder whose attention runs through the FlashInfer backend."""

import logging
from typing import Optional

import torch
from torch import nn

from protoserve.config import EngineConfig
from protoserve.flashinfer_backend import FlashInferBackend
from protoserve.forward_batch import ForwardBatch

logger = logging.getLogger(__name__)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_pos: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)
        self.register_buffer("cos_sin_cache", torch.cat([freqs.cos(), freqs.sin()], dim=-1), persistent=False)
        self.head_dim = head_dim

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        cos, sin = self.cos_sin_cache[positions][:, None, :].chunk(2, dim=-1)
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.reshape(x.shape[0], -1, self.head_dim).float().chunk(2, dim=-1)
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        return out.view(x.shape).to(x.dtype)


class RadixAttention(nn.Module):
    def __init__(self, layer_id: int, backend: FlashInferBackend, sliding_window: Optional[int]):
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.sliding_window = sliding_window

    def forward(self, q, k, v, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        if fb.forward_mode.is_decode():
            return self.forward_decode(q, k, v, positions, fb)
        logger.debug(f"layer {self.layer_id} extend q{tuple(q.shape)} window={self.sliding_window}")  # ok: FC101
        return self.backend.forward_extend(q, k, v, self, fb)

    def forward_decode(self, q, k, v, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        logger.debug(f"layer {self.layer_id} decode q{tuple(q.shape)} last_pos={positions[-1]}")  # expect: FC101
        return self.backend.forward_decode(q, k, v, self, fb)


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden, 2 * inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(nn.functional.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, backend: FlashInferBackend):
        super().__init__()
        self.q_size = cfg.num_attention_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        window = cfg.sliding_window if cfg.sliding_window and layer_id % 2 == 0 else None
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_context_len, cfg.rope_theta)
        self.attn = RadixAttention(layer_id, backend, window)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)

    def _pre_attn(self, positions: torch.Tensor, h: torch.Tensor):
        x = self.input_norm(h)
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary(positions, q, k)
        return q, k, v

    def _post_attn(self, o: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        h = residual + self.o_proj(o)
        return h + self.mlp(self.post_norm(h))

    def forward(self, positions: torch.Tensor, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, k, v = self._pre_attn(positions, h)
        return self._post_attn(self.attn(q, k, v, positions, fb), h)

    def forward_decode(self, positions: torch.Tensor, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, k, v = self._pre_attn(positions, h)
        return self._post_attn(self.attn.forward_decode(q, k, v, positions, fb), h)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: EngineConfig, attn_backend: FlashInferBackend):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i, attn_backend) for i in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer(positions, h, fb)
        return self._logits(h, fb)

    def decode_step(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """Decode-only entry point; the graph runner captures this one."""
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer.forward_decode(positions, h, fb)
        return self._logits(h, fb)

    def _logits(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        if fb.logits_indices is not None:
            h = h[fb.logits_indices]
        return self.lm_head(self.norm(h)).float()
