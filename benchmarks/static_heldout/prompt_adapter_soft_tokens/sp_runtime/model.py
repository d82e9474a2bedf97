"""A llama-shaped decoder whose input embeddings take soft tokens from the slot table."""

from typing import List

import torch
from torch import nn

from softprompt.attn.backend import SoftPromptAttention
from softprompt.attn.metadata import StepMetadata
from softprompt.config import SoftPromptConfig
from softprompt.slot_table import EmbeddingSlotTable


class SoftDecoderLayer(nn.Module):
    def __init__(self, cfg: SoftPromptConfig, backend: SoftPromptAttention, layer_id: int) -> None:
        super().__init__()
        self.backend = backend
        self.layer_id = layer_id
        self.num_qo_heads = cfg.num_qo_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        q_out = cfg.num_qo_heads * cfg.head_dim
        kv_out = cfg.num_kv_heads * cfg.head_dim
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.qkv = nn.Linear(cfg.hidden_size, q_out + 2 * kv_out, bias=False)
        self.o_proj = nn.Linear(q_out, cfg.hidden_size, bias=False)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False),
            nn.SiLU(),
            nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False),
        )

    def _split(self, h: torch.Tensor):
        q_out = self.num_qo_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        q, k, v = self.qkv(self.norm(h)).split([q_out, kv_out, kv_out], dim=-1)
        return (
            q.view(-1, self.num_qo_heads, self.head_dim),
            k.view(-1, self.num_kv_heads, self.head_dim),
            v.view(-1, self.num_kv_heads, self.head_dim),
        )

    def _finish(self, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        h = h + self.o_proj(o.reshape(h.shape[0], -1))
        return h + self.mlp(h)

    def decode(self, h: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        q, _, _ = self._split(h)
        return self._finish(h, self.backend.forward_decode(q, kv_cache, bs))

    def decode_eager(self, h: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        q, _, _ = self._split(h)
        return self._finish(h, self.backend.forward_decode_eager(q, kv_cache))

    def prefill(self, h: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(h)
        return self._finish(h, self.backend.forward_prefill(q, k, v))

    def prefill_long(self, h: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        q, _, _ = self._split(h)
        return self._finish(h, self.backend.forward_long_prefill(q, kv_cache))


class SoftPromptLM(nn.Module):
    def __init__(self, cfg: SoftPromptConfig, backend: SoftPromptAttention, table: EmbeddingSlotTable) -> None:
        super().__init__()
        self.cfg = cfg
        self.table = table
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([SoftDecoderLayer(cfg, backend, i) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def _inject(self, h, soft_mask, soft_slots, soft_offsets) -> torch.Tensor:
        # static shapes: every token gathers a table row, the mask keeps the soft ones
        soft = self.table.embeds[soft_slots, soft_offsets].to(h.dtype)
        return torch.where(soft_mask.unsqueeze(-1), soft, h)

    def forward_decode(self, input_ids: torch.Tensor, kv_caches: List[torch.Tensor], bs: int) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer.decode(h, kv, bs)
        return self.lm_head(self.norm(h))

    def forward_prefill(self, input_ids, soft_mask, soft_slots, soft_offsets) -> torch.Tensor:
        h = self._inject(self.embed(input_ids), soft_mask, soft_slots, soft_offsets)
        for layer in self.layers:
            h = layer.prefill(h)
        return self.lm_head(self.norm(h))

    def forward_eager(self, input_ids: torch.Tensor, kv_caches: List[torch.Tensor], meta: StepMetadata) -> torch.Tensor:
        if meta.is_decode:
            h = self.embed(input_ids)
            for layer, kv in zip(self.layers, kv_caches):
                h = layer.decode_eager(h, kv)
            return self.lm_head(self.norm(h))
        if meta.num_tokens >= self.cfg.long_prompt_threshold:
            h = self._inject(self.embed(input_ids), meta.soft_mask, meta.soft_slots, meta.soft_offsets)
            for layer, kv in zip(self.layers, kv_caches):
                h = layer.prefill_long(h, kv)
            return self.lm_head(self.norm(h))
        return self.forward_prefill(input_ids, meta.soft_mask, meta.soft_slots, meta.soft_offsets)
