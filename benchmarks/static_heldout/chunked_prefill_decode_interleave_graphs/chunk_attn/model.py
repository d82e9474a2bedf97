"""A Llama-shaped decoder with a decode path (graph-captured) and a mixed path (eager)."""

import torch
from torch import nn

from chunkserve.config import ChunkConfig
from chunk_attn.backend import InterleavedAttnBackend


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    half = x.shape[-1] // 2
    inv = 1.0 / (theta ** (torch.arange(half, device=x.device, dtype=torch.float32) / half))
    ang = positions.float()[:, None, None] * inv
    a, b = x[..., :half].float(), x[..., half:].float()
    return torch.cat([a * ang.cos() - b * ang.sin(), b * ang.cos() + a * ang.sin()], -1).to(x.dtype)


class ChunkAttention(nn.Module):
    def __init__(self, cfg: ChunkConfig, layer_id: int, backend: InterleavedAttnBackend):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.backend = backend
        self.q_size = cfg.num_qo_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.o = nn.Linear(self.q_size, cfg.hidden_size, bias=False)

    def _qkv(self, hidden: torch.Tensor, positions: torch.Tensor):
        cfg = self.cfg
        q, k, v = self.qkv(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = rotary(q.view(-1, cfg.num_qo_heads, cfg.head_dim), positions, cfg.rope_theta)
        k = rotary(k.view(-1, cfg.num_kv_heads, cfg.head_dim), positions, cfg.rope_theta)
        v = v.view(-1, cfg.num_kv_heads, cfg.head_dim)
        self.backend.write_kv(self.layer_id, k, v)
        return q, k, v

    def decode(self, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        q, _, _ = self._qkv(hidden, positions)
        return self.o(self.backend.decode_attention(self.layer_id, q).reshape(-1, self.q_size))

    def mixed(self, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(hidden, positions)
        return self.o(self.backend.mixed_attention(self.layer_id, q, k, v).reshape(-1, self.q_size))


class ChunkBlock(nn.Module):
    def __init__(self, cfg: ChunkConfig, layer_id: int, backend: InterleavedAttnBackend):
        super().__init__()
        self.attn = ChunkAttention(cfg, layer_id, backend)
        self.ln1 = nn.RMSNorm(cfg.hidden_size)
        self.ln2 = nn.RMSNorm(cfg.hidden_size)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def _ffn(self, hidden: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(self.ln2(hidden)).chunk(2, dim=-1)
        return hidden + self.down(nn.functional.silu(gate) * up)

    def decode(self, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self._ffn(hidden + self.attn.decode(self.ln1(hidden), positions))

    def mixed(self, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self._ffn(hidden + self.attn.mixed(self.ln1(hidden), positions))


class ChunkLM(nn.Module):
    def __init__(self, cfg: ChunkConfig, backend: InterleavedAttnBackend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.blocks = nn.ModuleList([ChunkBlock(cfg, i, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(input_ids)
        for block in self.blocks:
            hidden = block.decode(hidden, positions)
        return self.head(self.norm(hidden))

    def forward_mixed(self, input_ids: torch.Tensor, positions: torch.Tensor, logit_rows: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(input_ids)
        for block in self.blocks:
            hidden = block.mixed(hidden, positions)
        return self.head(self.norm(hidden.index_select(0, logit_rows)))
