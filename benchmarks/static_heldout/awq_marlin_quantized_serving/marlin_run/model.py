"""A Llama-shaped decoder whose projections run on Marlin AWQ GEMMs."""
from __future__ import annotations

from typing import Iterator, List

import torch
from torch import nn

from awq import AWQServeConfig, AWQWeightLoader, MarlinLinear
from marlin_attn.backend import AWQAttnBackend


class QuantAttention(nn.Module):
    def __init__(self, cfg: AWQServeConfig, prefix: str, loader: AWQWeightLoader, backend: AWQAttnBackend):
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        self.qkv_proj = MarlinLinear(loader.weights(prefix + ".qkv_proj"))
        self.o_proj = MarlinLinear(loader.weights(prefix + ".o_proj"))
        self.q_size = cfg.num_qo_heads * cfg.head_dim

    def _q(self, h: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(h)
        return qkv[:, : self.q_size].view(-1, self.cfg.num_qo_heads, self.cfg.head_dim)

    def forward_decode(self, h: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        out = self.backend.forward_decode(self._q(h), kv_cache)
        return self.o_proj(out.reshape(h.shape[0], -1))

    def forward_prefill(self, h: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        out = self.backend.forward_prefill(self._q(h), kv_cache)
        return self.o_proj(out.reshape(h.shape[0], -1))


class QuantDecoderLayer(nn.Module):
    def __init__(self, cfg: AWQServeConfig, idx: int, loader: AWQWeightLoader, backend: AWQAttnBackend):
        super().__init__()
        prefix = f"model.layers.{idx}"
        self.attn = QuantAttention(cfg, prefix + ".self_attn", loader, backend)
        self.gate_up = MarlinLinear(loader.weights(prefix + ".mlp.gate_up_proj"))
        self.down = MarlinLinear(loader.weights(prefix + ".mlp.down_proj"))
        self.norm = nn.RMSNorm(cfg.hidden_size)

    def _mlp(self, h: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(h).chunk(2, dim=-1)
        return self.down(nn.functional.silu(gate) * up)

    def forward_decode(self, h: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        h = h + self.attn.forward_decode(self.norm(h), kv_cache)
        return h + self._mlp(self.norm(h))

    def forward_prefill(self, h: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        h = h + self.attn.forward_prefill(self.norm(h), kv_cache)
        return h + self._mlp(self.norm(h))


class QuantLlama(nn.Module):
    def __init__(self, cfg: AWQServeConfig, loader: AWQWeightLoader, backend: AWQAttnBackend,
                 kv_caches: List[torch.Tensor]):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=torch.float16)
        self.layers = nn.ModuleList(QuantDecoderLayer(cfg, i, loader, backend) for i in range(cfg.num_layers))
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, dtype=torch.float16)
        self.kv_caches = kv_caches

    def quant_linears(self) -> Iterator[MarlinLinear]:
        for m in self.modules():
            if isinstance(m, MarlinLinear):
                yield m

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer.forward_decode(h, kv)
        return self.lm_head(h)

    def forward_prefill(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer.forward_prefill(h, kv)
        return self.lm_head(h)
