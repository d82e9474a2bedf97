"""The language model: LoRA on the query projection, cross-attention layers for images."""

from __future__ import annotations

import torch
import torch.nn as nn

from mavl import AdapterBank, RouterConfig
from mv_attn.backend import LMAttentionBackend


class LoRALinear(nn.Module):
    """Base projection plus the per-request adapter's low-rank delta (gathered by slot id)."""

    def __init__(self, in_features: int, out_features: int, bank: AdapterBank, layer_id: int):
        super().__init__()
        self.base = nn.Linear(in_features, out_features, bias=False)
        self.bank = bank
        self.layer_id = layer_id

    def forward(self, x: torch.Tensor, lora_ids: torch.Tensor) -> torch.Tensor:
        a = self.bank.lora_a[lora_ids, self.layer_id]
        b = self.bank.lora_b[lora_ids, self.layer_id]
        scale = self.bank.scaling[lora_ids]
        delta = torch.bmm(torch.bmm(x.unsqueeze(1), a), b).squeeze(1)
        return self.base(x) + delta * scale.unsqueeze(-1)


class LMLayer(nn.Module):
    def __init__(self, cfg: RouterConfig, layer_id: int, bank: AdapterBank, backend: LMAttentionBackend):
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.heads = cfg.num_qo_heads
        self.head_dim = cfg.head_dim
        self.is_cross = (layer_id + 1) % cfg.cross_every == 0
        self.q_proj = LoRALinear(cfg.hidden_size, cfg.num_qo_heads * cfg.head_dim, bank, layer_id)
        self.o_proj = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.norm = nn.RMSNorm(cfg.hidden_size)

    def forward_decode(self, h: torch.Tensor, lora_ids: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(self.norm(h), lora_ids).view(-1, self.heads, self.head_dim)
        if self.is_cross:
            out = self.backend.forward_cross(q)
        else:
            out = self.backend.forward_decode(q, kv_cache[self.layer_id])
        return h + self.o_proj(out.reshape(h.shape[0], -1))

    def forward_prompt(self, h: torch.Tensor, lora_ids: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(self.norm(h), lora_ids).view(-1, self.heads, self.head_dim)
        if self.is_cross:
            out = self.backend.forward_cross(q)
        else:
            out = self.backend.forward_prompt(q, kv_cache[self.layer_id])
        return h + self.o_proj(out.reshape(h.shape[0], -1))


class LoRALanguageModel(nn.Module):
    def __init__(self, cfg: RouterConfig, bank: AdapterBank, backend: LMAttentionBackend):
        super().__init__()
        self.backend = backend
        self.kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([LMLayer(cfg, i, bank, backend) for i in range(cfg.num_layers)])
        self.img_k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.img_v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def set_image_kv(self, image_embeds: torch.Tensor) -> None:
        n = image_embeds.shape[0]
        self.backend.img_k[:n].copy_(self.img_k_proj(image_embeds).view(n, self.kv_heads, self.head_dim))
        self.backend.img_v[:n].copy_(self.img_v_proj(image_embeds).view(n, self.kv_heads, self.head_dim))

    def forward_decode(self, input_ids: torch.Tensor, lora_ids: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_decode(h, lora_ids, kv_cache)
        return self.lm_head(self.norm(h))

    def forward_prompt(
        self, input_ids: torch.Tensor, image_embeds: torch.Tensor, image_pos: torch.Tensor,
        token_lora_ids: torch.Tensor, kv_cache: torch.Tensor,
    ) -> torch.Tensor:
        h = self.embed(input_ids)
        h[image_pos] = image_embeds.to(h.dtype)
        for layer in self.layers:
            h = layer.forward_prompt(h, token_lora_ids, kv_cache)
        return self.lm_head(self.norm(h))
