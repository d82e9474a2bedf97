"""Qwen3-Next decoder: three gated delta-net layers, then one gated full-attention layer, repeated."""
from __future__ import annotations

from typing import List

import torch
import torch.nn.functional as F
from torch import nn

from q3n.schema import ForwardBatch, Qwen3NextConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))  # zero-centred: scale is (1 + weight)
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor = None) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight.float())
        if gate is not None:
            xf = xf * F.silu(gate.float())
        return xf.to(x.dtype)


class GatedDeltaNetMixer(nn.Module):
    def __init__(self, cfg: Qwen3NextConfig, layer_id: int, linear_idx: int):
        super().__init__()
        self.layer_id, self.linear_idx = layer_id, linear_idx
        self.v_heads, self.v_dim = cfg.linear_num_value_heads, cfg.linear_value_head_dim
        self.split = (cfg.conv_dim, cfg.linear_value_dim)
        self.in_proj_qkvz = nn.Linear(cfg.hidden_size, cfg.conv_dim + cfg.linear_value_dim, bias=False)
        self.in_proj_ba = nn.Linear(cfg.hidden_size, 2 * cfg.linear_num_value_heads, bias=False)
        self.conv_weight = nn.Parameter(torch.empty(cfg.conv_dim, cfg.linear_conv_kernel_dim))
        self.A_log = nn.Parameter(torch.zeros(cfg.linear_num_value_heads))
        self.dt_bias = nn.Parameter(torch.ones(cfg.linear_num_value_heads))
        self.norm = RMSNorm(cfg.linear_value_head_dim, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(cfg.linear_value_dim, cfg.hidden_size, bias=False)

    def _inputs(self, h: torch.Tensor):
        mixed_qkv, z = torch.split(self.in_proj_qkvz(h), self.split, dim=-1)
        b, a = self.in_proj_ba(h).chunk(2, dim=-1)
        args = (mixed_qkv.contiguous(), b.contiguous(), a.contiguous(), self.linear_idx, self.conv_weight, self.A_log, self.dt_bias)
        return args, z.reshape(-1, self.v_heads, self.v_dim)

    def _output(self, core: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.norm(core.reshape(-1, self.v_heads, self.v_dim), z).flatten(1))

    def decode(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        args, z = self._inputs(h)
        return self._output(fb.attn_backend.forward_linear_decode(*args), z)

    def extend(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        args, z = self._inputs(h)
        return self._output(fb.attn_backend.forward_linear_extend(*args), z)


class FullAttentionMixer(nn.Module):
    """Gated attention: q_proj also yields a sigmoid output gate; q/k get their own RMSNorm."""

    def __init__(self, cfg: Qwen3NextConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, 2 * self.heads * self.head_dim, bias=False)
        self.kv_proj = nn.Linear(cfg.hidden_size, 2 * self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def _qkv(self, h: torch.Tensor, fb: ForwardBatch):
        q, gate = self.q_proj(h).view(-1, self.heads, 2 * self.head_dim).chunk(2, dim=-1)
        k, v = self.kv_proj(h).view(-1, 2 * self.kv_heads, self.head_dim).chunk(2, dim=1)
        q, k = self.q_norm(q), self.k_norm(k)  # partial rotary is fused into save_full_kv / the kernels
        fb.attn_backend.save_full_kv(self.layer_id, k, v, fb.out_cache_loc)
        return q, torch.sigmoid(gate.reshape(h.shape[0], -1))

    def decode(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, gate = self._qkv(h, fb)
        o = fb.attn_backend.forward_full_decode(q, self.layer_id)
        return self.o_proj(o.reshape(h.shape[0], -1) * gate)

    def extend(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, gate = self._qkv(h, fb)
        o = fb.attn_backend.forward_full_extend(q, self.layer_id)
        return self.o_proj(o.reshape(h.shape[0], -1) * gate)


class HybridDecoderLayer(nn.Module):
    def __init__(self, cfg: Qwen3NextConfig, layer_id: int, linear_idx: int):
        super().__init__()
        if cfg.is_full_attention(layer_id):
            self.mixer = FullAttentionMixer(cfg, layer_id)
        else:
            self.mixer = GatedDeltaNetMixer(cfg, layer_id, linear_idx)
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def _mlp(self, h: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(self.post_norm(h)).chunk(2, dim=-1)
        return h + self.down(F.silu(gate) * up)

    def decode(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        return self._mlp(h + self.mixer.decode(self.input_norm(h), fb))

    def extend(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        return self._mlp(h + self.mixer.extend(self.input_norm(h), fb))


class Qwen3NextForCausalLM(nn.Module):
    def __init__(self, cfg: Qwen3NextConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        layers: List[HybridDecoderLayer] = []
        linear_idx = 0
        for layer_id in range(cfg.num_hidden_layers):
            layers.append(HybridDecoderLayer(cfg, layer_id, linear_idx))
            if not cfg.is_full_attention(layer_id):
                linear_idx += 1
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        if fb.forward_mode.is_decode():
            return self.decode(input_ids, positions, fb)
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer.extend(h, fb)
        last = torch.cumsum(fb.extend_seq_lens, dim=0) - 1
        return self.lm_head(self.norm(h[last.long()]))

    def decode(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer.decode(h, fb)
        return self.lm_head(self.norm(h))
