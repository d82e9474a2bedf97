"""A Llama decoder whose every reduction is batch-invariant."""

from __future__ import annotations

import torch
from flashinfer.rope import apply_rope_with_cos_sin_cache_inplace
from torch import nn

from bisrv.determinism import DeterminismConfig
from bisrv.forward_batch import ForwardBatch
from bisrv.layers.invariant_ops import rms_norm_invariant


class LlamaAttention(nn.Module):
    def __init__(self, det: DeterminismConfig, layer_id: int, device, dtype):
        super().__init__()
        self.det = det
        self.layer_id = layer_id
        h, kv, d = det.num_qo_heads, det.num_kv_heads, det.head_dim
        self.q_size, self.kv_size = h * d, kv * d
        self.qkv = nn.Linear(det.hidden_size, self.q_size + 2 * self.kv_size, bias=False, device=device, dtype=dtype)
        self.o_proj = nn.Linear(self.q_size, det.hidden_size, bias=False, device=device, dtype=dtype)
        inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d))
        t = torch.arange(det.max_context_len, dtype=torch.float32, device=device)
        f = torch.outer(t, inv)
        self.register_buffer("cos_sin_cache", torch.cat([f.cos(), f.sin()], dim=-1), persistent=False)

    def _qkv(self, h: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch):
        q, k, v = self.qkv(h).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        apply_rope_with_cos_sin_cache_inplace(positions, q, k, self.det.head_dim, self.cos_sin_cache, is_neox=True)
        kvh, d = self.det.num_kv_heads, self.det.head_dim
        fb.attn_backend.kv_pool.set_kv_buffer(self.layer_id, fb.out_cache_loc, k.view(-1, kvh, d), v.view(-1, kvh, d))
        return q

    def forward_decode(self, h: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q = self._qkv(h, positions, fb)
        if self.det.use_trtllm_decode:
            o = fb.attn_backend.forward_decode_trtllm(q, self.layer_id, fb)
        else:
            o = fb.attn_backend.forward_decode(q, self.layer_id, fb)
        return self.o_proj(o.reshape(h.shape[0], -1))

    def forward_extend(self, h: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q = self._qkv(h, positions, fb)
        o = fb.attn_backend.forward_extend(q, self.layer_id, fb)
        return self.o_proj(o.reshape(h.shape[0], -1))


class LlamaBlock(nn.Module):
    def __init__(self, det: DeterminismConfig, layer_id: int, device, dtype):
        super().__init__()
        self.attn = LlamaAttention(det, layer_id, device, dtype)
        inter = det.hidden_size * 7 // 2
        self.gate_up = nn.Linear(det.hidden_size, 2 * inter, bias=False, device=device, dtype=dtype)
        self.down = nn.Linear(inter, det.hidden_size, bias=False, device=device, dtype=dtype)
        self.ln1 = nn.Parameter(torch.ones(det.hidden_size, device=device, dtype=dtype))
        self.ln2 = nn.Parameter(torch.ones(det.hidden_size, device=device, dtype=dtype))

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.gate_up(rms_norm_invariant(x, self.ln2)).chunk(2, dim=-1)
        return self.down(nn.functional.silu(g) * u)

    def forward_decode(self, h, positions, fb):
        h = h + self.attn.forward_decode(rms_norm_invariant(h, self.ln1), positions, fb)
        return h + self._mlp(h)

    def forward_extend(self, h, positions, fb):
        h = h + self.attn.forward_extend(rms_norm_invariant(h, self.ln1), positions, fb)
        return h + self._mlp(h)


class InvariantLlama(nn.Module):
    def __init__(self, det: DeterminismConfig, device, dtype=torch.bfloat16):
        super().__init__()
        self.embed = nn.Embedding(det.vocab_size, det.hidden_size, device=device, dtype=dtype)
        self.layers = nn.ModuleList([LlamaBlock(det, i, device, dtype) for i in range(det.num_layers)])
        self.norm = nn.Parameter(torch.ones(det.hidden_size, device=device, dtype=dtype))
        self.lm_head = nn.Linear(det.hidden_size, det.vocab_size, bias=False, device=device, dtype=dtype)

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_decode(h, positions, fb)
        return self.lm_head(rms_norm_invariant(h, self.norm)).float()

    def forward_extend(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_extend(h, positions, fb)
        last = torch.cumsum(fb.extend_lens, 0) - 1
        return self.lm_head(rms_norm_invariant(h[last], self.norm)).float()
