"""A Gemma-2-shaped decoder (soft-capped global layers) over the pipelined backend."""

import torch
from torch import nn

from asyncpipe.config import PipelineConfig
from pipe_exec.attention import FlashInferPipelineBackend


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    half = x.shape[-1] // 2
    inv = 1.0 / (theta ** (torch.arange(half, device=x.device, dtype=torch.float32) / half))
    ang = positions.float()[:, None, None] * inv
    a, b = x[..., :half].float(), x[..., half:].float()
    return torch.cat([a * ang.cos() - b * ang.sin(), b * ang.cos() + a * ang.sin()], -1).to(x.dtype)


class PipelineAttention(nn.Module):
    def __init__(self, cfg: PipelineConfig, layer_id: int, backend: FlashInferPipelineBackend):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.backend = backend
        self.q_size = cfg.num_qo_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.out = nn.Linear(self.q_size, cfg.hidden_size, bias=False)

    def _qkv(self, hidden: torch.Tensor, positions: torch.Tensor):
        cfg = self.cfg
        q, k, v = self.qkv(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = rope(q.view(-1, cfg.num_qo_heads, cfg.head_dim), positions, cfg.rope_theta)
        k = rope(k.view(-1, cfg.num_kv_heads, cfg.head_dim), positions, cfg.rope_theta)
        v = v.view(-1, cfg.num_kv_heads, cfg.head_dim)
        self.backend.write_kv(self.layer_id, k, v)
        return q, k, v

    def decode(self, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        q, _, _ = self._qkv(hidden, positions)
        return self.out(self.backend.forward_decode(self.layer_id, q).reshape(-1, self.q_size))

    def prefill(self, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(hidden, positions)
        return self.out(self.backend.forward_prefill(self.layer_id, q, k, v).reshape(-1, self.q_size))


class PipelineBlock(nn.Module):
    def __init__(self, cfg: PipelineConfig, layer_id: int, backend: FlashInferPipelineBackend):
        super().__init__()
        self.attn = PipelineAttention(cfg, layer_id, backend)
        self.pre_attn = nn.RMSNorm(cfg.hidden_size)
        self.post_attn = nn.RMSNorm(cfg.hidden_size)
        self.pre_mlp = nn.RMSNorm(cfg.hidden_size)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def _mlp(self, hidden: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(self.pre_mlp(hidden)).chunk(2, dim=-1)
        return hidden + self.down(nn.functional.gelu(gate, approximate="tanh") * up)

    def decode(self, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self._mlp(hidden + self.post_attn(self.attn.decode(self.pre_attn(hidden), positions)))

    def prefill(self, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self._mlp(hidden + self.post_attn(self.attn.prefill(self.pre_attn(hidden), positions)))


class PipelineLM(nn.Module):
    def __init__(self, cfg: PipelineConfig, backend: FlashInferPipelineBackend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.blocks = nn.ModuleList([PipelineBlock(cfg, i, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.scale = cfg.hidden_size**0.5

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(hidden) @ self.embed.weight.t()

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(input_ids) * self.scale
        for block in self.blocks:
            hidden = block.decode(hidden, positions)
        return self._logits(hidden)

    def forward_prefill(self, input_ids: torch.Tensor, positions: torch.Tensor, last_rows: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(input_ids) * self.scale
        for block in self.blocks:
            hidden = block.prefill(hidden, positions)
        return self._logits(hidden.index_select(0, last_rows))
