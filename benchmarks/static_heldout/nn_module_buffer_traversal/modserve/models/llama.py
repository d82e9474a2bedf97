"""Llama-style decoder with alternating sliding-window and global attention layers."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from modserve.batch import ForwardBatch
from modserve.config import EngineConfig
from modserve.layers.attention import PagedAttention
from modserve.layers.buffers import GraphInputBuffers
from modserve.layers.rotary import RotaryEmbedding
from modserve.models.lookahead import LookaheadHead


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


class LlamaMLP(nn.Module):
    def __init__(self, cfg: EngineConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int):
        super().__init__()
        self.num_heads = cfg.num_qo_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.q_size = cfg.num_qo_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.max_context_len, cfg.rope_theta)
        window = cfg.sliding_window if cfg.is_window_layer(layer_id) else None
        self.attn = PagedAttention(layer_id, cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, window)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        qkv = self.qkv_proj(hidden)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        o = self.attn(
            q.view(-1, self.num_heads, self.head_dim),
            k.view(-1, self.num_kv_heads, self.head_dim),
            v.view(-1, self.num_kv_heads, self.head_dim),
            fb,
        )
        return self.o_proj(o.reshape(-1, self.q_size))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg, layer_id)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        hidden = hidden + self.self_attn(positions, self.input_layernorm(hidden), fb)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class LlamaModel(nn.Module):
    def __init__(self, cfg: EngineConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([LlamaDecoderLayer(cfg, i) for i in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        for layer in self.layers:
            hidden = layer(positions, hidden, fb)
        return self.norm(hidden)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: EngineConfig):
        super().__init__()
        self.cfg = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        # Graph inputs ride along with the weights: model.to(device) moves them.
        self.attn_state = GraphInputBuffers(cfg.max_num_reqs, cfg.max_pages, cfg.max_num_tokens)
        if cfg.enable_lookahead:
            self.lookahead_head = LookaheadHead(cfg)

    def _last_token_index(self, fb: ForwardBatch, device: torch.device) -> torch.Tensor:
        last = np.cumsum(fb.extend_lens_cpu) - 1
        return torch.from_numpy(last).to(device, non_blocking=True)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch):
        hidden = self.model(input_ids, positions, fb)
        if not fb.is_decode:
            hidden = hidden.index_select(0, self._last_token_index(fb, hidden.device))
        logits = self.lm_head(hidden)
        for _, child in self.named_children():
            if isinstance(child, LookaheadHead):
                return logits, child(hidden)
        return logits, None
