"""A one-block stand-in for either model; its KV cache is indexed by the shared pool's block ids."""
from __future__ import annotations

import torch
from torch import nn


class DecoderModel(nn.Module):
    def __init__(self, cfg, hidden_size: int, num_blocks: int, device: torch.device):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.page = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size
        q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.embed, self.qkv_proj = nn.Embedding(cfg.vocab_size, hidden_size), nn.Linear(hidden_size, q + 2 * kv)
        self.o_proj, self.lm_head = nn.Linear(q, hidden_size), nn.Linear(hidden_size, cfg.vocab_size, bias=False)
        self.splits = [q, kv, kv]
        shape = (num_blocks, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_cache = torch.zeros(shape, dtype=torch.bfloat16, device=device)

    def project(self, input_ids: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(self.embed(input_ids)).split(self.splits, dim=-1)
        blk, off = slots // self.page, slots % self.page
        self.kv_cache[blk, 0, off] = k.view(-1, self.kv_heads, self.head_dim)
        self.kv_cache[blk, 1, off] = v.view(-1, self.kv_heads, self.head_dim)
        return q.view(-1, self.heads, self.head_dim)

    def finish(self, attn_out: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.o_proj(attn_out.flatten(1)))
