"""A Gemma-3-1B-shaped decoder with W8A8 projections: five sliding-window layers per global layer."""
import torch
from torch import nn

from edge.quant import Int8Linear
from edge.settings import EdgeSettings
from edge.runtime.attention import EdgeAttention, PrefillChunk
from edge.runtime.kv import StaticKVPages


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    half = x.shape[-1] // 2
    inv = theta ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    ang = positions.float()[:, None] * inv[None, :]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


class EdgeLayer(nn.Module):
    def __init__(self, s: EdgeSettings, layer_id: int, attn: EdgeAttention, kv: StaticKVPages):
        super().__init__()
        self.layer_id = layer_id
        self.attn = attn
        self.kv = kv
        self.nq, self.nkv, self.hd = s.num_qo_heads, s.num_kv_heads, s.head_dim
        self.theta = 1_000_000.0 if s.is_global(layer_id) else 10_000.0
        self.in_norm = nn.RMSNorm(s.hidden_size)
        self.post_norm = nn.RMSNorm(s.hidden_size)
        self.qkv = Int8Linear(s.hidden_size, (s.num_qo_heads + 2 * s.num_kv_heads) * s.head_dim)
        self.o = Int8Linear(s.num_qo_heads * s.head_dim, s.hidden_size)
        self.gate_up = Int8Linear(s.hidden_size, 2 * s.intermediate_size)
        self.down = Int8Linear(s.intermediate_size, s.hidden_size)

    def _qkv(self, h: torch.Tensor, positions: torch.Tensor):
        q, k, v = self.qkv(self.in_norm(h)).split([self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q = rope(q.view(-1, self.nq, self.hd), positions, self.theta)
        k = rope(k.view(-1, self.nkv, self.hd), positions, self.theta)
        return q, k, v.view(-1, self.nkv, self.hd)

    def _mlp(self, h: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(self.post_norm(h)).chunk(2, dim=-1)
        return h + self.down(nn.functional.gelu(gate, approximate="tanh") * up)

    def decode(self, h: torch.Tensor, positions: torch.Tensor, i: int) -> torch.Tensor:
        q, _, _ = self._qkv(h, positions)
        o = self.attn.forward_decode(q, self.kv.caches[self.layer_id], self.layer_id, i)
        return self._mlp(h + self.o(o.reshape(h.shape[0], -1)))

    def prefill(self, h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(h, positions)
        o = self.attn.forward_prefill(q, k, v, self.kv.caches[self.layer_id])
        return self._mlp(h + self.o(o.reshape(h.shape[0], -1)))


class EdgeLM(nn.Module):
    def __init__(self, s: EdgeSettings, attn: EdgeAttention, kv: StaticKVPages):
        super().__init__()
        self.embed = nn.Embedding(s.vocab_size, s.hidden_size)
        self.layers = nn.ModuleList([EdgeLayer(s, i, attn, kv) for i in range(s.num_layers)])
        self.norm = nn.RMSNorm(s.hidden_size)
        self.scale = s.hidden_size ** 0.5

    def decode(self, input_ids: torch.Tensor, positions: torch.Tensor, i: int) -> torch.Tensor:
        h = self.embed(input_ids) * self.scale
        for layer in self.layers:
            h = layer.decode(h, positions, i)
        return (self.norm(h) @ self.embed.weight.t()).float()

    def prefill(self, chunk: PrefillChunk) -> torch.Tensor:
        h = self.embed(chunk.input_ids) * self.scale
        for layer in self.layers:
            h = layer.prefill(h, chunk.positions)
        return (self.norm(h[-1:]) @ self.embed.weight.t()).float()
