"""DeepSeek-V3 (absorbed MLA, dense MLP for brevity) and its multi-token-prediction module."""
from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F
from torch import nn

from dsv3_mtp.mla_backend import FlashInferMLABackend
from dsv3_mtp.spec import DeepseekV3Config


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (self.weight * xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class Rotary(nn.Module):
    def __init__(self, dim: int, theta: float, max_pos: int = 163840):
        super().__init__()
        inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv)
        self.register_buffer("cos_sin", torch.cat([freqs.cos(), freqs.sin()], dim=-1), persistent=False)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        cos, sin = self.cos_sin[positions].unsqueeze(-2).chunk(2, dim=-1)
        x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
        return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2).to(x.dtype)


class MLAAttention(nn.Module):
    def __init__(self, cfg: DeepseekV3Config, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.h, self.nope, self.rope, self.rank = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank
        self.q_a_proj = nn.Linear(cfg.hidden_size, cfg.q_lora_rank, bias=False)
        self.q_a_norm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
        self.q_b_proj = nn.Linear(cfg.q_lora_rank, self.h * (self.nope + self.rope), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(cfg.hidden_size, self.rank + self.rope, bias=False)
        self.kv_a_norm = RMSNorm(self.rank, cfg.rms_norm_eps)
        self.w_kc = nn.Parameter(torch.empty(self.h, self.nope, self.rank))
        self.w_vc = nn.Parameter(torch.empty(self.h, self.rank, cfg.v_head_dim))
        self.o_proj = nn.Linear(self.h * cfg.v_head_dim, cfg.hidden_size, bias=False)
        self.rotary = Rotary(self.rope, cfg.rope_theta)

    def forward(self, h: torch.Tensor, positions: torch.Tensor, attn: FlashInferMLABackend) -> torch.Tensor:
        q = self.q_b_proj(self.q_a_norm(self.q_a_proj(h))).view(-1, self.h, self.nope + self.rope)
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        ckv, k_pe = self.kv_a_proj_with_mqa(h).split([self.rank, self.rope], dim=-1)
        q_pe = self.rotary(positions, q_pe)
        k_pe = self.rotary(positions, k_pe.unsqueeze(1)).squeeze(1)
        attn.save_mla_kv(self.layer_id, self.kv_a_norm(ckv), k_pe)
        q_absorbed = torch.einsum("thd,hdc->thc", q_nope, self.w_kc)
        o = attn.forward_mla(q_absorbed, q_pe, self.layer_id)
        return self.o_proj(torch.einsum("thc,hcv->thv", o, self.w_vc).flatten(1))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DeepseekV3Config, layer_id: int):
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = MLAAttention(cfg, layer_id)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, h: torch.Tensor, positions: torch.Tensor, attn: FlashInferMLABackend) -> torch.Tensor:
        h = h + self.self_attn(self.input_norm(h), positions, attn)
        gate, up = self.gate_up(self.post_norm(h)).chunk(2, dim=-1)
        return h + self.down(F.silu(gate) * up)


class DeepseekV3ForCausalLM(nn.Module):
    def __init__(self, cfg: DeepseekV3Config):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: FlashInferMLABackend) -> Tuple[torch.Tensor, torch.Tensor]:
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer(h, positions, attn)
        h = self.norm(h)
        return self.lm_head(h), h


class DeepseekV3MTP(nn.Module):
    """Predicts token t+2 from the target's hidden state at t and the embedding of token t+1."""

    def __init__(self, cfg: DeepseekV3Config, embed_tokens: nn.Embedding, lm_head: nn.Linear):
        super().__init__()
        self.embed_tokens = embed_tokens
        self.lm_head = lm_head
        self.enorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hnorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.layer = DecoderLayer(cfg, cfg.num_hidden_layers)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor, attn: FlashInferMLABackend
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        e = self.enorm(self.embed_tokens(input_ids))
        h = self.eh_proj(torch.cat([e, self.hnorm(hidden_states)], dim=-1))
        h = self.norm(self.layer(h, positions, attn))
        return self.lm_head(h), h
