"""Decoder model; the class decorator wraps its forward_* methods in a NaN guard."""
from typing import List

import torch
from flashinfer.rope import apply_rope_pos_ids
from torch import nn

from attn.backend import FlashInferBackend
from attn.trtllm_gen import TrtllmGenDecode
from dwserve.batch import ForwardBatch
from dwserve.config import ServeConfig
from dwserve.decorators import instrument_forwards

LAYER_KINDS = ("full", "window", "softcap", "local", "trtllm")


@torch.jit.script
def soft_cap(x: torch.Tensor, cap: float) -> torch.Tensor:
    assert cap > 0.0, "soft cap must be positive"  # ok: FC109
    return torch.tanh(x / cap) * cap


@instrument_forwards
class DecoderModel(nn.Module):
    def __init__(self, cfg: ServeConfig, backend: FlashInferBackend, trtllm: TrtllmGenDecode):
        super().__init__()
        self.backend, self.trtllm = backend, trtllm
        self.kinds = [LAYER_KINDS[i % len(LAYER_KINDS)] for i in range(cfg.num_layers)] + ["mtp"]
        self.heads = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.num_kv_heads)
        self.sizes = [n * cfg.head_dim for n in self.heads]
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.qkv = nn.ModuleList(nn.Linear(cfg.hidden_size, sum(self.sizes), bias=False) for _ in self.kinds)
        self.o = nn.ModuleList(nn.Linear(self.sizes[0], cfg.hidden_size, bias=False) for _ in self.kinds)
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
    def _qkv(self, i: int, h: torch.Tensor, positions: torch.Tensor):
        q, k, v = (t.unflatten(-1, (n, -1)) for t, n in zip(self.qkv[i](h).split(self.sizes, dim=-1), self.heads))
        q, k = apply_rope_pos_ids(q, k, positions)  # new K/V reach the paged cache through the fused writer
        return q, k, v
    def _decode_layer(self, i: int, h: torch.Tensor, positions, kv_cache: torch.Tensor, batch: ForwardBatch):
        q, _, _ = self._qkv(i, h, positions)
        if self.kinds[i] == "trtllm":
            o = self.trtllm.forward(q, kv_cache, batch)
        elif self.kinds[i] == "mtp":
            o = self.trtllm.forward_draft(q, kv_cache)
        else:
            o = self.backend.forward_decode(q, kv_cache, self.kinds[i])
        return self.o[i](o.flatten(1))
    def forward_decode(self, input_ids, positions, kv_caches: List[torch.Tensor], batch: ForwardBatch):
        h = self.embed(input_ids)
        for i, kv in enumerate(kv_caches):
            h = h + self._decode_layer(i, h, positions, kv, batch)
        return self.norm(h)
    def forward_extend(self, input_ids, positions, kv_caches: List[torch.Tensor], batch: ForwardBatch):
        h = self.embed(input_ids)
        for i, kv in enumerate(kv_caches):
            q, k, v = self._qkv(i, h, positions)
            h = h + self.o[i](self.backend.forward_extend(q, k, v, kv).flatten(1))
        return self.norm(h)
    def forward_mtp(self, hidden, positions, kv_cache: torch.Tensor, batch: ForwardBatch):
        return self.norm(hidden + self._decode_layer(len(self.kinds) - 1, hidden, positions, kv_cache, batch))
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return soft_cap(self.lm_head(hidden).float(), 30.0)
