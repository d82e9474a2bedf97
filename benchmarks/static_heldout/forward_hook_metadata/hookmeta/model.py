"""A Llama/Gemma-2-shaped decoder: alternating sliding-window and full attention layers.

Nothing here plans attention: the forward pre-hooks that `MetadataHooks` installs do, from the
``forward_batch=`` keyword every module below is called with.
"""

import torch
import torch.nn.functional as F
from torch import nn

from hookmeta.attention.backend import HookedFlashInferBackend
from hookmeta.config import EngineConfig
from hookmeta.forward_batch import ForwardBatch


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_position: int, base: float = 500000.0):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
        self.register_buffer("cos_cache", freqs.cos(), persistent=False)
        self.register_buffer("sin_cache", freqs.sin(), persistent=False)
        self.max_position = max_position

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        if int(positions.max()) >= self.max_position:  # expect: FC101
            raise ValueError(f"position beyond the rotary cache of {self.max_position}")
        cos = self.cos_cache[positions].unsqueeze(1)
        sin = self.sin_cache[positions].unsqueeze(1)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


class PagedAttention(nn.Module):
    sliding = False

    def __init__(self, cfg: EngineConfig, layer_id: int, backend: HookedFlashInferBackend, rotary: RotaryEmbedding):
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.rotary = rotary
        self.nq, self.nkv, self.hd = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, (self.nq + 2 * self.nkv) * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nq * self.hd, cfg.hidden_size, bias=False)

    def _project(self, hidden: torch.Tensor, forward_batch: ForwardBatch):
        qkv = self.qkv_proj(hidden)
        q, k, v = qkv.split([self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q, k = self.rotary(forward_batch.positions, q.view(-1, self.nq, self.hd), k.view(-1, self.nkv, self.hd))
        return q, k, v.view(-1, self.nkv, self.hd)

    def forward(self, hidden: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        q, k, v = self._project(hidden, forward_batch)
        out = self.backend.forward(q, k, v, self.layer_id, forward_batch)
        return self.o_proj(out.reshape(-1, self.nq * self.hd))


class SlidingPagedAttention(PagedAttention):
    sliding = True

    def forward(self, hidden: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        q, k, v = self._project(hidden, forward_batch)
        if forward_batch.forward_mode.is_decode():
            out = self.backend.forward_window(q, k, v, self.layer_id, forward_batch)
        else:
            out = self.backend.forward(q, k, v, self.layer_id, forward_batch)
        return self.o_proj(out.reshape(-1, self.nq * self.hd))


class MLP(nn.Module):
    def __init__(self, cfg: EngineConfig):
        super().__init__()
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, backend: HookedFlashInferBackend, rotary: RotaryEmbedding):
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden_size)
        self.post_attn_norm = RMSNorm(cfg.hidden_size)
        self.attn = (
            SlidingPagedAttention(cfg, layer_id, backend, rotary)
            if cfg.is_sliding(layer_id)
            else PagedAttention(cfg, layer_id, backend, rotary)
        )
        self.mlp = MLP(cfg)

    def forward(self, hidden: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        # keyword call: the window layer's pre-hook reads `forward_batch` from its kwargs
        hidden = hidden + self.attn(self.input_norm(hidden), forward_batch=forward_batch)
        return hidden + self.mlp(self.post_attn_norm(hidden))


class HookedDecoder(nn.Module):
    def __init__(self, cfg: EngineConfig, backend: HookedFlashInferBackend):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        rotary = RotaryEmbedding(cfg.head_dim, cfg.max_context_len)
        layers = []
        for layer_id in range(cfg.num_layers):
            layers.append(DecoderLayer(cfg, layer_id, backend, rotary))
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, *, forward_batch: ForwardBatch) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        for layer in self.layers:
            hidden = layer(hidden, forward_batch=forward_batch)
        hidden = self.norm(hidden)
        last_token = forward_batch.qo_indptr[1:] - 1
        return self.lm_head(hidden[last_token])
