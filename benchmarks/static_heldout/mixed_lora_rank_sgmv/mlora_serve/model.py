"""A Llama-shaped decoder whose attention output projection carries the batch's LoRA adapters."""
from typing import List

import torch
from torch import nn

from mlora.adapters import AdapterSlotTable
from mlora.config import EngineConfig
from mlora.segments import SegmentInfo
from mlora_serve.attention import LoraAttnBackend
from mlora_serve.lora_layers import LoraLinear


class LoraDecoderLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, slots: AdapterSlotTable, attn: LoraAttnBackend):
        super().__init__()
        self.layer_id = layer_id
        self.attn = attn
        self.num_q, self.num_kv, self.head_dim = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.norm1 = nn.RMSNorm(cfg.hidden_size)
        self.norm2 = nn.RMSNorm(cfg.hidden_size)
        self.qkv_proj = nn.Linear(cfg.hidden_size, (cfg.num_qo_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, bias=False)
        self.o_proj = LoraLinear(nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, bias=False), slots, layer_id, cfg.max_prefill_tokens)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * 4 * cfg.hidden_size, bias=False)
        self.down = nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False)

    def _q(self, h: torch.Tensor) -> torch.Tensor:
        q, _, _ = self.qkv_proj(self.norm1(h)).split(
            [self.num_q * self.head_dim, self.num_kv * self.head_dim, self.num_kv * self.head_dim], dim=-1
        )
        return q.view(-1, self.num_q, self.head_dim)

    def _finish(self, h: torch.Tensor, o: torch.Tensor, info: SegmentInfo) -> torch.Tensor:
        h = h + self.o_proj(o.reshape(h.shape[0], -1), info)
        gate, up = self.gate_up(self.norm2(h)).chunk(2, dim=-1)
        return h + self.down(nn.functional.silu(gate) * up)

    def forward_decode(self, h: torch.Tensor, kv_cache: torch.Tensor, info: SegmentInfo) -> torch.Tensor:
        return self._finish(h, self.attn.forward_decode(self._q(h), kv_cache, self.layer_id), info)

    def forward_prefill(self, h: torch.Tensor, kv_cache: torch.Tensor, info: SegmentInfo) -> torch.Tensor:
        return self._finish(h, self.attn.forward_prefill(self._q(h), kv_cache), info)


class LoraLlama(nn.Module):
    def __init__(self, cfg: EngineConfig, slots: AdapterSlotTable, attn: LoraAttnBackend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([LoraDecoderLayer(cfg, i, slots, attn) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.kv_caches: List[torch.Tensor] = []

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, info: SegmentInfo) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv_cache in zip(self.layers, self.kv_caches):
            h = layer.forward_decode(h, kv_cache, info)
        return self.lm_head(self.norm(h)).float()

    def prefill(self, input_ids: torch.Tensor, positions: torch.Tensor, info: SegmentInfo) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv_cache in zip(self.layers, self.kv_caches):
            h = layer.forward_prefill(h, kv_cache, info)
        return self.lm_head(self.norm(h)).float()
