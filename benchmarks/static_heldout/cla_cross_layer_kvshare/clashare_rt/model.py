"""A decoder whose layers share KV across groups of ``cla_factor`` layers."""
from __future__ import annotations

import torch
from torch import nn

from clashare.attn.backend import CLAFlashInferBackend
from clashare.config import CLAConfig
from clashare.groups import LayerGroupMap
from clashare_rt.forward_batch import ForwardBatch


class CLAAttention(nn.Module):
    def __init__(self, cfg: CLAConfig, layer_id: int, group_map: LayerGroupMap, backend: CLAFlashInferBackend):
        super().__init__()
        self.layer_id = layer_id
        self.nq = cfg.num_q_heads
        self.nkv = cfg.num_kv_heads
        self.hd = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.nq * self.hd, bias=False)
        # only the producer layer of a group projects K/V
        self.kv_proj = (
            nn.Linear(cfg.hidden_size, 2 * self.nkv * self.hd, bias=False) if group_map.is_producer(layer_id) else None
        )
        self.o_proj = nn.Linear(self.nq * self.hd, cfg.hidden_size, bias=False)
        self.backend = backend

    def _qkv(self, h: torch.Tensor):
        q = self.q_proj(h).view(-1, self.nq, self.hd)
        if self.kv_proj is None:
            return q, None, None
        k, v = self.kv_proj(h).view(-1, 2, self.nkv, self.hd).unbind(1)
        return q, k, v

    def attend_decode(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, k, v = self._qkv(h)
        out = self.backend.forward_decode(self.layer_id, q, k, v, fb)
        return self.o_proj(out.reshape(-1, self.nq * self.hd))

    def attend_extend(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, k, v = self._qkv(h)
        out = self.backend.forward_extend(self.layer_id, q, k, v, fb)
        return self.o_proj(out.reshape(-1, self.nq * self.hd))


class CLADecoderLayer(nn.Module):
    def __init__(self, cfg: CLAConfig, layer_id: int, group_map: LayerGroupMap, backend: CLAFlashInferBackend):
        super().__init__()
        self.attn = CLAAttention(cfg, layer_id, group_map, backend)
        self.norm1 = nn.RMSNorm(cfg.hidden_size)
        self.norm2 = nn.RMSNorm(cfg.hidden_size)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size, bias=False),
            nn.SiLU(),
            nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False),
        )

    def decode(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = h + self.attn.attend_decode(self.norm1(h), fb)
        return h + self.mlp(self.norm2(h))

    def extend(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = h + self.attn.attend_extend(self.norm1(h), fb)
        return h + self.mlp(self.norm2(h))


class CLAModel(nn.Module):
    def __init__(self, cfg: CLAConfig, group_map: LayerGroupMap, backend: CLAFlashInferBackend, vocab: int = 32000):
        super().__init__()
        self.embed = nn.Embedding(vocab, cfg.hidden_size)
        self.layers = nn.ModuleList(
            [CLADecoderLayer(cfg, i, group_map, backend) for i in range(cfg.num_layers)]
        )
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, vocab, bias=False)

    def decode_tokens(self, input_ids: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.decode(h, fb)
        return self.lm_head(self.norm(h))

    def extend_tokens(self, input_ids: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.extend(h, fb)
        return self.lm_head(self.norm(h))
