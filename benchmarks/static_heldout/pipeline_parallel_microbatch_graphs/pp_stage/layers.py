"""The slice of decoder layers one pipeline stage owns."""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from ppserve.config import PipelineConfig, StageSpec
from pp_stage.attention import StageForwardMeta


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    half = x.shape[-1] // 2
    inv = 1.0 / (theta ** (torch.arange(0, half, device=x.device, dtype=torch.float32) / half))
    freqs = positions.float()[:, None] * inv[None, :]
    cos, sin = freqs.cos()[:, None, :], freqs.sin()[:, None, :]
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class StageAttnLayer(nn.Module):
    def __init__(self, cfg: PipelineConfig, layer_id: int, is_window: bool):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.is_window = is_window
        self.window_left = cfg.sliding_window - 1 if is_window else -1
        self.q_size = cfg.num_qo_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)

    def _qkv(self, h: torch.Tensor, positions: torch.Tensor):
        cfg = self.cfg
        q, k, v = self.qkv_proj(h).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = _rope(q.view(-1, cfg.num_qo_heads, cfg.head_dim), positions, cfg.rope_theta)
        k = _rope(k.view(-1, cfg.num_kv_heads, cfg.head_dim), positions, cfg.rope_theta)
        return q, k, v.view(-1, cfg.num_kv_heads, cfg.head_dim)

    @staticmethod
    def _write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: StageForwardMeta) -> None:
        # HND pages: [num_pages, 2, kv_heads, page_size, head_dim]
        kv_cache[meta.slot_pages, 0, :, meta.slot_offsets] = k
        kv_cache[meta.slot_pages, 1, :, meta.slot_offsets] = v

    def decode(self, h: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
               meta: StageForwardMeta) -> torch.Tensor:
        q, k, v = self._qkv(h, positions)
        self._write_kv(kv_cache, k, v, meta)
        if meta.use_long_ctx:
            o = trtllm_batch_decode_with_kv_cache(
                query=q,
                kv_cache=kv_cache,
                workspace_buffer=meta.workspace,
                block_tables=meta.block_tables,
                seq_lens=meta.seq_lens,
                max_seq_len=meta.max_seq_len,
                bmm1_scale=self.cfg.sm_scale,
                bmm2_scale=1.0,
                window_left=self.window_left,
            )
        elif self.is_window:
            o = meta.window_wrapper.run(q, kv_cache)  # expect: FC108
        else:
            o = meta.decode_wrapper.run(q, kv_cache)  # ok: FC108
        return self.o_proj(o.reshape(h.shape[0], -1))

    def prefill(self, h: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
                meta: StageForwardMeta) -> torch.Tensor:
        # chunked prefill keeps every chunk inside the window, so window layers run causal here
        q, k, v = self._qkv(h, positions)
        self._write_kv(kv_cache, k, v, meta)
        o = meta.prefill_wrapper.run(q, kv_cache)
        return self.o_proj(o.reshape(h.shape[0], -1))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: PipelineConfig, layer_id: int, local_id: int, is_window: bool):
        super().__init__()
        self.local_id = local_id
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.attn = StageAttnLayer(cfg, layer_id, is_window)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def _pre(self, h: torch.Tensor, residual: Optional[torch.Tensor]):
        residual = h if residual is None else h + residual
        return self.input_norm(residual), residual

    def _mlp(self, h: torch.Tensor, residual: torch.Tensor):
        residual = h + residual
        gate, up = self.gate_up(self.post_norm(residual)).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up), residual

    def decode(self, h, residual, positions, kv_cache, meta: StageForwardMeta):
        x, residual = self._pre(h, residual)
        return self._mlp(self.attn.decode(x, positions, kv_cache, meta), residual)

    def prefill(self, h, residual, positions, kv_cache, meta: StageForwardMeta):
        x, residual = self._pre(h, residual)
        return self._mlp(self.attn.prefill(x, positions, kv_cache, meta), residual)


class StageLayers(nn.Module):
    def __init__(self, cfg: PipelineConfig, spec: StageSpec, kv_cache: torch.Tensor, is_last: bool):
        super().__init__()
        layers: List[DecoderLayer] = []
        for local_id, layer_id in enumerate(range(spec.first_layer, spec.last_layer)):
            layers.append(DecoderLayer(cfg, layer_id, local_id, spec.is_window_layer(layer_id)))
        self.layers = nn.ModuleList(layers)
        self.kv_cache = kv_cache
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size) if spec.is_first else None
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps) if is_last else None
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) if is_last else None

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward_decode(self, hidden: torch.Tensor, residual: Optional[torch.Tensor], positions: torch.Tensor,
                       meta: StageForwardMeta) -> Tuple[torch.Tensor, torch.Tensor]:
        for layer in self.layers:
            hidden, residual = layer.decode(hidden, residual, positions, self.kv_cache[layer.local_id], meta)
        return hidden, residual

    def forward_prefill(self, hidden: torch.Tensor, residual: Optional[torch.Tensor], positions: torch.Tensor,
                        meta: StageForwardMeta) -> Tuple[torch.Tensor, torch.Tensor]:
        for layer in self.layers:
            hidden, residual = layer.prefill(hidden, residual, positions, self.kv_cache[layer.local_id], meta)
        return hidden, residual

    def logits(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden + residual))
