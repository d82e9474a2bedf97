"""Decoder layers; attention takes its wrappers from the metadata in context, not from the layer."""
from typing import List

import torch
from flashinfer.cascade import merge_state
from flashinfer.rope import apply_rope_pos_ids
from torch import nn

from backends.flashinfer_backend import FlashInferAttnBackend
from ctxserve.config import ServeConfig
from ctxserve.context import CAPTURE_BS, current_meta

LAYER_KINDS = ("full", "window", "chunk", "trtllm")

@torch.jit.script
def soft_cap(x: torch.Tensor, cap: float) -> torch.Tensor:
    assert cap > 0.0, "soft cap must be positive"  # ok: FC109
    return torch.tanh(x / cap) * cap

def attend_decode(backend: FlashInferAttnBackend, kind: str, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
    meta = current_meta()
    meta.kv_last_page_len.clamp_(min=1)  # expect: FC104
    if meta.decode_wrapper._kv_layout == "HND":  # expect: FC103
        kv_cache = kv_cache.transpose(2, 3)
    if kind == "window":
        return meta.window_wrapper.run(q, kv_cache)  # expect: FC108
    if kind == "chunk":
        return backend.chunk_wrapper.run(q, kv_cache)  # expect: FC108
    if kind == "trtllm":
        return backend.trtllm.forward(q, kv_cache)
    o, lse = meta.decode_wrapper.run_return_lse(q, kv_cache)  # ok: FC108
    if meta.shared_prefix_len:
        o_prefix, lse_prefix = meta.prefix_wrapper.run_return_lse(q, kv_cache)  # expect: FC108
        o = merge_state(o, lse, o_prefix, lse_prefix)[0]
    return o

class DecoderModel(nn.Module):
    def __init__(self, cfg: ServeConfig, backend: FlashInferAttnBackend):
        super().__init__()
        self.cfg, self.backend = cfg, backend
        self.kinds = [LAYER_KINDS[i % len(LAYER_KINDS)] for i in range(cfg.num_layers)]
        self.heads = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.num_kv_heads)
        self.sizes = [n * cfg.head_dim for n in self.heads]
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.qkv = nn.ModuleList(nn.Linear(cfg.hidden_size, sum(self.sizes), bias=False) for _ in range(cfg.num_layers + 1))
        self.o = nn.ModuleList(nn.Linear(self.sizes[0], cfg.hidden_size, bias=False) for _ in range(cfg.num_layers + 1))
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
    def _qkv(self, i: int, h: torch.Tensor, positions: torch.Tensor):
        q, k, v = (t.unflatten(-1, (n, -1)) for t, n in zip(self.qkv[i](h).split(self.sizes, dim=-1), self.heads))
        q, k = apply_rope_pos_ids(q, k, positions)  # new K/V reach the paged cache through the fused writer
        return q, k, v
    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: List[torch.Tensor]):
        meta = current_meta()
        if (meta.seq_lens >= self.cfg.context_len).any():  # expect: FC101
            raise ValueError("a sequence reached context_len inside the decode forward")
        bs = CAPTURE_BS.get() or input_ids.shape[0]  # ok: FC101
        h = self.embed(input_ids[:bs])
        for i, kv in enumerate(kv_caches):
            q, _, _ = self._qkv(i, h, positions[:bs])
            h = h + self.o[i](attend_decode(self.backend, self.kinds[i], q, kv).flatten(1))
        return self.norm(h)
    def forward_draft(self, hidden: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor):
        """MTP head: one extra layer on the trtllm-gen draft wrapper."""
        q, _, _ = self._qkv(len(self.kinds), hidden, positions)
        return self.norm(hidden + self.o[-1](self.backend.trtllm.forward_draft(q, kv_cache).flatten(1)))
    def forward_extend(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: List[torch.Tensor]):
        h = self.embed(input_ids)
        for i, kv in enumerate(kv_caches):
            q, k, v = self._qkv(i, h, positions)
            h = h + self.o[i](self.backend.forward_extend(q, k, v, kv).flatten(1))
        return self.norm(h)
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return soft_cap(self.lm_head(hidden).float(), 30.0)
