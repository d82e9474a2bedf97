"""The decoder. Layers are folded over with ``functools.reduce`` and a partial of a per-layer function."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Tuple

import torch
from torch import nn

from opserve.batch import extend_seq_lens_cpu_of
from opserve.config import EngineConfig

if TYPE_CHECKING:
    from opserve.attention.backend import FlashInferPipelineBackend
    from opserve.stages import StepContext


def _rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    half = x.shape[-1] // 2
    freqs = torch.arange(half, device=x.device, dtype=torch.float32)
    angles = positions.float().unsqueeze(-1) * theta ** (-freqs / half)
    cos, sin = angles.cos().unsqueeze(1), angles.sin().unsqueeze(1)
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, device: torch.device, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, device=device))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps) * self.weight).to(x.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, device: torch.device):
        super().__init__()
        self.layer_id = layer_id
        self.num_qo_heads = cfg.num_qo_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.rope_theta = cfg.rope_theta
        windowed = cfg.window_layer_stride and layer_id % cfg.window_layer_stride == 0
        self.sliding_window = cfg.sliding_window if windowed else 0
        self.scaling = cfg.head_dim**-0.5
        q_size = cfg.num_qo_heads * cfg.head_dim
        kv_size = cfg.num_kv_heads * cfg.head_dim
        self.split = (q_size, kv_size, kv_size)
        linear = functools.partial(nn.Linear, bias=False, device=device, dtype=cfg.dtype)
        self.input_norm = RMSNorm(cfg.hidden_size, device)
        self.post_norm = RMSNorm(cfg.hidden_size, device)
        self.qkv_proj = linear(cfg.hidden_size, q_size + 2 * kv_size)
        self.o_proj = linear(q_size, cfg.hidden_size)
        self.gate_up = linear(cfg.hidden_size, 2 * cfg.intermediate_size)
        self.down = linear(cfg.intermediate_size, cfg.hidden_size)
        # FP8 KV dequant scales: the kernels read the device ones; the host copies serve the planners.
        self.k_scale = nn.Parameter(torch.ones((), dtype=torch.float32, device=device), requires_grad=False)
        self.v_scale = nn.Parameter(torch.ones((), dtype=torch.float32, device=device), requires_grad=False)
        self.k_scale_host = torch.ones((), dtype=torch.float32)
        self.v_scale_host = torch.ones((), dtype=torch.float32)

    def project_qkv(self, hidden: torch.Tensor, positions: torch.Tensor):
        q, k, v = self.qkv_proj(hidden).split(self.split, dim=-1)
        q = q.view(-1, self.num_qo_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        return _rotate(q, positions, self.rope_theta), _rotate(k, positions, self.rope_theta), v

    def mlp_block(self, hidden: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(self.post_norm(hidden)).chunk(2, dim=-1)
        return self.down(nn.functional.silu(gate) * up)

    def load_kv_scales(self, k_scale: float, v_scale: float) -> None:
        self.k_scale.fill_(k_scale)
        self.v_scale.fill_(v_scale)
        self.k_scale_host.fill_(k_scale)
        self.v_scale_host.fill_(v_scale)


def layer_bmm_scales(layer: DecoderLayer, *, q_scale: float) -> Tuple[float, float]:
    """trtllm-gen folds the KV dequant scales into its two bmm scales."""
    k_scale = layer.k_scale.item()  # expect: FC101
    v_scale = float(layer.v_scale_host)  # ok: FC101
    return layer.scaling * q_scale * k_scale, v_scale


def _decode_layer(
    hidden: torch.Tensor, layer: DecoderLayer, *, ctx: "StepContext", backend: "FlashInferPipelineBackend"
) -> torch.Tensor:
    q, k, v = layer.project_qkv(layer.input_norm(hidden), ctx.batch.positions)
    backend.store_kv(layer, k, v, ctx.batch.out_cache_loc)
    o = backend.forward_decode(q, layer, ctx)
    hidden = hidden + layer.o_proj(o.flatten(1))
    return hidden + layer.mlp_block(hidden)


def _extend_layer(
    hidden: torch.Tensor, layer: DecoderLayer, *, ctx: "StepContext", backend: "FlashInferPipelineBackend"
) -> torch.Tensor:
    q, k, v = layer.project_qkv(layer.input_norm(hidden), ctx.batch.positions)
    backend.store_kv(layer, k, v, ctx.batch.out_cache_loc)
    o = backend.forward_extend(q, k, v, layer, ctx)
    hidden = hidden + layer.o_proj(o.flatten(1))
    return hidden + layer.mlp_block(hidden)


class PipelineModel(nn.Module):
    def __init__(self, cfg: EngineConfig, backend: "FlashInferPipelineBackend", device: torch.device):
        super().__init__()
        self.backend = backend
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, device=device, dtype=cfg.dtype)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i, device) for i in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, device)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, device=device, dtype=cfg.dtype)

    def forward(self, ctx: "StepContext") -> torch.Tensor:
        if ctx.batch.is_decode:
            return self.forward_decode(ctx)
        return self.forward_extend(ctx)

    def forward_decode(self, ctx: "StepContext") -> torch.Tensor:
        hidden = self.embed_tokens(ctx.batch.input_ids)
        step = functools.partial(_decode_layer, ctx=ctx, backend=self.backend)
        hidden = functools.reduce(step, self.layers, hidden)
        return self.lm_head(self.norm(hidden))

    def forward_extend(self, ctx: "StepContext") -> torch.Tensor:
        hidden = self.embed_tokens(ctx.batch.input_ids)
        step = functools.partial(_extend_layer, ctx=ctx, backend=self.backend)
        hidden = functools.reduce(step, self.layers, hidden)
        last = torch.cumsum(extend_seq_lens_cpu_of(ctx.batch), 0) - 1
        return self.lm_head(self.norm(hidden[last.to(hidden.device, non_blocking=True)]))
