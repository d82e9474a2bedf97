from __future__ import annotations

import torch
from torch import nn

from duoserve.config import DuoConfig
from duoserve.kvcache.head_pattern import HeadPattern
from duoserve.layers.duo_backend import DuoFlashInferBackend
from duoserve.runner.forward_batch import ForwardBatch


def rotary(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ang = pos.float()[:, None] * inv
    c, s = ang.cos()[:, None], ang.sin()[:, None]
    a, b = x[..., : d // 2].float(), x[..., d // 2:].float()
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1).to(x.dtype)


class DuoAttention(nn.Module):
    def __init__(self, cfg: DuoConfig, backend: DuoFlashInferBackend, pattern: HeadPattern, layer_id: int):
        super().__init__()
        self.backend = backend
        self.layer_id = layer_id
        self.h, self.kvh, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.group = cfg.num_heads // cfg.num_kv_heads
        self.theta = cfg.rope_theta
        self.qkv = nn.Linear(cfg.hidden_size, (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, bias=False)
        self.o = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.device = torch.device(cfg.device)
        # per query head gate (its KV head's gate) and the layer's retrieval threshold
        self.q_gate = torch.as_tensor(pattern.gates[layer_id], device=self.device).repeat_interleave(self.group)
        self.threshold = float(pattern.thresholds[layer_id])
        self.ret_kv_idx = torch.as_tensor(pattern.retrieval_kv_idx[layer_id], device=self.device)
        self.str_kv_idx = torch.as_tensor(pattern.stream_kv_idx[layer_id], device=self.device)
        self.ret_q_idx = (self.ret_kv_idx[:, None] * self.group + torch.arange(self.group, device=self.device)).flatten()
        self.str_q_idx = (self.str_kv_idx[:, None] * self.group + torch.arange(self.group, device=self.device)).flatten()

    def _qkv(self, positions: torch.Tensor, x: torch.Tensor):
        q, k, v = self.qkv(x).split([self.h * self.d, self.kvh * self.d, self.kvh * self.d], dim=-1)
        q = rotary(q.view(-1, self.h, self.d), positions, self.theta)
        k = rotary(k.view(-1, self.kvh, self.d), positions, self.theta)
        return q, k, v.view(-1, self.kvh, self.d)

    def forward_extend(self, positions, x, fb: ForwardBatch):
        q, k, v = self._qkv(positions, x)
        out = self.backend.forward_extend(q, k, v)
        self.backend.pool.store(self.layer_id, k.index_select(1, self.ret_kv_idx), v.index_select(1, self.ret_kv_idx),
                                k.index_select(1, self.str_kv_idx), v.index_select(1, self.str_kv_idx),
                                fb.full_loc, fb.stream_loc)
        return self.o(out.flatten(1))

    def forward_decode(self, positions, x, fb: ForwardBatch):
        q, k, v = self._qkv(positions, x)
        self.backend.pool.store(self.layer_id, k.index_select(1, self.ret_kv_idx), v.index_select(1, self.ret_kv_idx),
                                k.index_select(1, self.str_kv_idx), v.index_select(1, self.str_kv_idx),
                                fb.full_loc, fb.stream_loc)
        is_ret = self.q_gate >= self.threshold
        q_r, q_s = q[:, is_ret], q[:, ~is_ret]  # expect: FC101
        out_r, out_s = self.backend.forward_decode(q_r, q_s, self.layer_id)
        out = torch.empty_like(q)
        out.index_copy_(1, self.ret_q_idx, out_r)
        out.index_copy_(1, self.str_q_idx, out_s)
        return self.o(out.flatten(1))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DuoConfig, backend: DuoFlashInferBackend, pattern: HeadPattern, layer_id: int):
        super().__init__()
        self.attn = DuoAttention(cfg, backend, pattern, layer_id)
        self.ln1 = nn.RMSNorm(cfg.hidden_size)
        self.ln2 = nn.RMSNorm(cfg.hidden_size)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * 14336, bias=False)
        self.down = nn.Linear(14336, cfg.hidden_size, bias=False)

    def _mlp(self, x):
        g, u = self.gate_up(x).chunk(2, dim=-1)
        return self.down(nn.functional.silu(g) * u)

    def forward_extend(self, positions, x, fb):
        x = x + self.attn.forward_extend(positions, self.ln1(x), fb)
        return x + self._mlp(self.ln2(x))

    def forward_decode(self, positions, x, fb):
        x = x + self.attn.forward_decode(positions, self.ln1(x), fb)
        return x + self._mlp(self.ln2(x))


class DuoLlamaForCausalLM(nn.Module):
    def __init__(self, cfg: DuoConfig, backend: DuoFlashInferBackend, pattern: HeadPattern):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, backend, pattern, i) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_extend(self, input_ids, positions, fb: ForwardBatch):
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer.forward_extend(positions, x, fb)
        return self.lm_head(self.norm(x))

    def forward_decode(self, input_ids, positions, fb: ForwardBatch):
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer.forward_decode(positions, x, fb)
        return self.lm_head(self.norm(x))
