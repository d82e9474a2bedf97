"""A small DeepSeek-style MoE decoder: attention through the forward batch's backend, then the overlapped MoE."""

from __future__ import annotations

import torch
from torch import nn

from sidemoe.batch import ForwardBatch
from sidemoe.config import ServeConfig
from sidemoe.moe.overlap import SharedExpertOverlap
from sidemoe.streams import SideStreamPair


class SelfAttention(nn.Module):
    def __init__(self, cfg: ServeConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.num_qo_heads = cfg.num_qo_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        qkv_out = (cfg.num_qo_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, qkv_out, bias=False)
        self.o_proj = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def _project(self, h: torch.Tensor):
        q_size = self.num_qo_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        q, k, v = self.qkv(h).split([q_size, kv_size, kv_size], dim=-1)
        return (q.view(-1, self.num_qo_heads, self.head_dim), k.view(-1, self.num_kv_heads, self.head_dim),
                v.view(-1, self.num_kv_heads, self.head_dim))

    def decode(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, k, v = self._project(h)
        o = fb.attn_backend.forward_decode(q, k, v, self.layer_id, fb)
        return self.o_proj(o.reshape(h.shape[0], -1))

    def extend(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, k, v = self._project(h)
        o = fb.attn_backend.forward_extend(q, k, v, self.layer_id, fb)
        return self.o_proj(o.reshape(h.shape[0], -1))


class MoEDecoderLayer(nn.Module):
    def __init__(self, cfg: ServeConfig, layer_id: int, streams: SideStreamPair, device: torch.device):
        super().__init__()
        self.layer_id = layer_id
        self.in_norm = nn.RMSNorm(cfg.hidden_size)
        self.post_norm = nn.RMSNorm(cfg.hidden_size)
        self.attn = SelfAttention(cfg, layer_id)
        self.moe = SharedExpertOverlap(cfg, layer_id, streams, device)

    def decode_step(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = h + self.attn.decode(self.in_norm(h), fb)
        return h + self.moe(self.post_norm(h))

    def extend_step(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = h + self.attn.extend(self.in_norm(h), fb)
        return h + self.moe(self.post_norm(h))


class MoEModel(nn.Module):
    def __init__(self, cfg: ServeConfig, streams: SideStreamPair, device: torch.device, vocab_size: int = 32000):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([MoEDecoderLayer(cfg, i, streams, device) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, vocab_size, bias=False)

    def forward_decode_graph(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.decode_step(h, fb)
        return self.lm_head(self.norm(h))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.decode_step(h, fb) if fb.forward_mode.is_decode() else layer.extend_step(h, fb)
        return self.lm_head(self.norm(h))
