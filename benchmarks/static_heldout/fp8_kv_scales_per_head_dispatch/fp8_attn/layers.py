"""A Qwen-shaped decoder; each layer's attention dispatches on its KV dtype."""

import torch
from torch import nn

from fp8kv.config import Fp8ServeConfig
from fp8_attn.backend import Fp8DispatchBackend


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    half = x.shape[-1] // 2
    inv = 1.0 / (theta ** (torch.arange(half, device=x.device, dtype=torch.float32) / half))
    ang = positions.float()[:, None, None] * inv
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()], -1).to(x.dtype)


class Fp8Attention(nn.Module):
    def __init__(self, cfg: Fp8ServeConfig, layer_id: int, backend: Fp8DispatchBackend):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.backend = backend
        self.q_size = cfg.num_qo_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=True)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)

    def _project(self, hidden: torch.Tensor, positions: torch.Tensor):
        cfg = self.cfg
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = rotary(q.view(-1, cfg.num_qo_heads, cfg.head_dim), positions, cfg.rope_theta)
        k = rotary(k.view(-1, cfg.num_kv_heads, cfg.head_dim), positions, cfg.rope_theta)
        return q, k, v.view(-1, cfg.num_kv_heads, cfg.head_dim)

    def decode(self, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        q, k, v = self._project(hidden, positions)
        self.backend.write_kv(self.layer_id, k, v)
        out = self.backend.decode_attention(self.layer_id, q)
        return self.o_proj(out.reshape(-1, self.q_size))

    def prefill(self, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        q, k, v = self._project(hidden, positions)
        self.backend.write_kv(self.layer_id, k, v)
        out = self.backend.prefill_attention(self.layer_id, q)
        return self.o_proj(out.reshape(-1, self.q_size))


class Fp8DecoderLayer(nn.Module):
    def __init__(self, cfg: Fp8ServeConfig, layer_id: int, backend: Fp8DispatchBackend):
        super().__init__()
        self.attn = Fp8Attention(cfg, layer_id, backend)
        self.ln1 = nn.RMSNorm(cfg.hidden_size)
        self.ln2 = nn.RMSNorm(cfg.hidden_size)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def _mlp(self, hidden: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(self.ln2(hidden)).chunk(2, dim=-1)
        return hidden + self.down(nn.functional.silu(gate) * up)

    def decode(self, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self._mlp(hidden + self.attn.decode(self.ln1(hidden), positions))

    def prefill(self, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self._mlp(hidden + self.attn.prefill(self.ln1(hidden), positions))


class Fp8Model(nn.Module):
    def __init__(self, cfg: Fp8ServeConfig, backend: Fp8DispatchBackend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([Fp8DecoderLayer(cfg, i, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(input_ids)
        for layer in self.layers:
            hidden = layer.decode(hidden, positions)
        return self.lm_head(self.norm(hidden))

    def forward_prefill(self, input_ids: torch.Tensor, positions: torch.Tensor, last_rows: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(input_ids)
        for layer in self.layers:
            hidden = layer.prefill(hidden, positions)
        return self.lm_head(self.norm(hidden.index_select(0, last_rows)))
