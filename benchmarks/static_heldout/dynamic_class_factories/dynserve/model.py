"""A Llama-style decoder whose modules register themselves through ``RegisteredMeta``.

``build_model`` looks the architecture up in the metaclass registry; every module's ``forward`` is
wrapped by the metaclass (NVTX ranges when enabled).
"""

from __future__ import annotations

import torch
from torch import nn

from .config import EngineConfig
from .forward_batch import ForwardBatch
from .meta import RegisteredMeta


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int) -> torch.Tensor:
    x = x.view(x.shape[0], -1, head_dim)
    x1, x2 = x.chunk(2, dim=-1)
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(1)


class RotaryEmbedding(nn.Module, metaclass=RegisteredMeta, kind="rope"):
    def __init__(self, head_dim: int, base: float, max_position: int, device: str) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.base = base
        self.register_buffer("cos_sin_cache", self._table(0, max_position, device), persistent=False)

    def _table(self, start: int, end: int, device) -> torch.Tensor:
        inv_freq = 1.0 / (self.base ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=device) / self.head_dim))
        t = torch.arange(start, end, dtype=torch.float32, device=device)
        freqs = torch.outer(t, inv_freq)
        return torch.cat([freqs.cos(), freqs.sin()], dim=-1)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        needed = int(positions.max()) + 1  # expect: FC101
        if needed > self.cos_sin_cache.shape[0]:
            # positions past the table (rope-scaled long prompts): extend it
            extra = self._table(self.cos_sin_cache.shape[0], 2 * needed, positions.device)
            self.cos_sin_cache = torch.cat([self.cos_sin_cache, extra], dim=0)  # expect: FC107
        cos, sin = self.cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)
        return _rotate(q, cos, sin, self.head_dim), _rotate(k, cos, sin, self.head_dim)


class RMSNorm(nn.Module, metaclass=RegisteredMeta, kind="rmsnorm"):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


class Attention(nn.Module, metaclass=RegisteredMeta, kind="attention"):
    def __init__(self, cfg: EngineConfig, layer_id: int, backend) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = cfg.num_q_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.scaling = cfg.head_dim ** -0.5
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        self.split = [q_size, kv_size, kv_size]
        self.qkv_proj = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=False)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.max_position_embeddings, cfg.device)
        self.backend = backend

    def forward(self, positions: torch.Tensor, h: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        q, k, v = self.qkv_proj(h).split(self.split, dim=-1)
        q, k = self.rotary(positions, q, k)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        return self.o_proj(self.backend.forward(q, k, v, self, batch))


class MLP(nn.Module, metaclass=RegisteredMeta, kind="mlp"):
    def __init__(self, cfg: EngineConfig) -> None:
        super().__init__()
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(nn.functional.silu(gate) * up)


class DecoderLayer(nn.Module, metaclass=RegisteredMeta, kind="decoder"):
    def __init__(self, cfg: EngineConfig, layer_id: int, backend) -> None:
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg, layer_id, backend)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, positions: torch.Tensor, h: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        h = h + self.attn(positions, self.input_norm(h), batch)
        return h + self.mlp(self.post_norm(h))


class LlamaForCausalLM(nn.Module, metaclass=RegisteredMeta, kind="llama"):
    def __init__(self, cfg: EngineConfig, backend) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, backend) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        h = self.embed(batch.input_ids)
        for layer in self.layers:
            h = layer(batch.positions, h, batch)
        return self.lm_head(self.norm(h))


def build_model(cfg: EngineConfig, backend) -> nn.Module:
    model_cls = RegisteredMeta.lookup(cfg.architecture)
    return model_cls(cfg, backend).to(device=cfg.device, dtype=cfg.dtype)
