"""Decoder with vLLM-style attention layers that call the KV connector hooks."""
from __future__ import annotations

import torch
from torch import nn

from lmc_connector.attention.flashinfer_builder import FlashInferMetadata
from lmc_connector.config import EngineLimits
from lmc_connector.forward_context import get_forward_context


class FlashInferImpl:
    def __init__(self, num_heads: int, head_dim: int) -> None:
        self.num_heads = num_heads
        self.head_dim = head_dim

    def forward(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: FlashInferMetadata) -> torch.Tensor:
        out = torch.empty_like(q)
        nd = meta.num_decode_tokens
        n = meta.num_actual_tokens
        if meta.prefill_wrapper is not None:
            # also the uniform spec-decode batches (query length 1 + k) land here
            out[nd:n] = meta.prefill_wrapper.run(q[nd:n], kv_cache)  # expect: FC108
        if meta.decode_wrapper is not None:
            out[:nd] = meta.decode_wrapper.run(q[:nd], kv_cache)  # ok: FC108
        return out


class Attention(nn.Module):
    def __init__(self, limits: EngineLimits, layer_name: str) -> None:
        super().__init__()
        self.layer_name = layer_name
        self.impl = FlashInferImpl(limits.num_qo_heads, limits.head_dim)
        self.kv_cache = torch.zeros(
            limits.num_blocks, 2, limits.block_size, limits.num_kv_heads, limits.head_dim,
            dtype=torch.bfloat16, device="cuda",
        )

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        ctx = get_forward_context()
        connector = ctx.connector
        if connector is not None:
            connector.wait_for_layer_load(self.layer_name)
        out = self.impl.forward(q, self.kv_cache, ctx.attn_metadata)
        if connector is not None:
            connector.save_kv_layer(self.layer_name, self.kv_cache, ctx.attn_metadata)
        return out


class DecoderLayer(nn.Module):
    def __init__(self, limits: EngineLimits, idx: int) -> None:
        super().__init__()
        hidden = limits.num_qo_heads * limits.head_dim
        self.heads = limits.num_qo_heads
        self.head_dim = limits.head_dim
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.attn = Attention(limits, f"model.layers.{idx}.self_attn")
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.SiLU(), nn.Linear(4 * hidden, hidden))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(h).view(-1, self.heads, self.head_dim)
        h = h + self.o_proj(self.attn(q).flatten(1))
        return h + self.mlp(h)


class LMCModel(nn.Module):
    def __init__(self, limits: EngineLimits, vocab_size: int = 128256) -> None:
        super().__init__()
        hidden = limits.num_qo_heads * limits.head_dim
        self.embed = nn.Embedding(vocab_size, hidden)
        self.layers = nn.ModuleList([DecoderLayer(limits, i) for i in range(limits.num_layers)])
        self.lm_head = nn.Linear(hidden, vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h)
        return h

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
