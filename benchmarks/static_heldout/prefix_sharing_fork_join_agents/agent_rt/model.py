"""A Llama-shaped decoder whose attention goes through the cascade backend."""

import torch
from torch import nn

from agentkv.config import AgentServeConfig
from agent_rt.cascade_backend import CascadeAgentBackend


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    half = x.shape[-1] // 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, half, device=x.device, dtype=torch.float32) / half))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    cos, sin = freqs.cos()[:, None, :], freqs.sin()[:, None, :]
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class AgentAttention(nn.Module):
    def __init__(self, cfg: AgentServeConfig, layer_id: int, backend: CascadeAgentBackend):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.backend = backend
        self.q_size = cfg.num_qo_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = apply_rope(q.view(-1, cfg.num_qo_heads, cfg.head_dim), positions, cfg.rope_theta)
        k = apply_rope(k.view(-1, cfg.num_kv_heads, cfg.head_dim), positions, cfg.rope_theta)
        v = v.view(-1, cfg.num_kv_heads, cfg.head_dim)
        self.backend.store_kv(self.layer_id, k, v)
        out = self.backend.decode_attention(q, self.layer_id)
        return self.o_proj(out.reshape(-1, self.q_size))


class AgentDecoderLayer(nn.Module):
    def __init__(self, cfg: AgentServeConfig, layer_id: int, backend: CascadeAgentBackend):
        super().__init__()
        self.input_norm = nn.RMSNorm(cfg.hidden_size)
        self.attn = AgentAttention(cfg, layer_id, backend)
        self.post_norm = nn.RMSNorm(cfg.hidden_size)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * 4 * cfg.hidden_size, bias=False)
        self.down = nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False)

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.attn(self.input_norm(hidden), positions)
        gate, up = self.gate_up(self.post_norm(hidden)).chunk(2, dim=-1)
        return hidden + self.down(nn.functional.silu(gate) * up)


class AgentModel(nn.Module):
    def __init__(self, cfg: AgentServeConfig, backend: CascadeAgentBackend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([AgentDecoderLayer(cfg, i, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(input_ids)
        for layer in self.layers:
            hidden = layer(hidden, positions)
        return self.lm_head(self.norm(hidden))
