"""A small Llama-shaped decoder over the seeded backend."""

from __future__ import annotations

import dataclasses

import flashinfer
import torch
from torch import nn

from seedserve.batch import DecodeBatch
from seedserve.config import ServeConfig

from .backend import SeededAttnBackend


@dataclasses.dataclass
class PrefillInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    batch_indices: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    last_rows: torch.Tensor


class SeedAttention(nn.Module):
    def __init__(self, cfg: ServeConfig, layer_id: int, backend: SeededAttnBackend):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.backend = backend
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)

    def forward_decode(self, h: torch.Tensor, fb: DecodeBatch, batch_indices: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(h).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.cfg.num_heads, self.cfg.head_dim)
        k = k.view(-1, self.cfg.num_kv_heads, self.cfg.head_dim)
        v = v.view(-1, self.cfg.num_kv_heads, self.cfg.head_dim)
        flashinfer.apply_rope_pos_ids_inplace(q, k, fb.positions)
        flashinfer.append_paged_kv_cache(
            k,
            v,
            batch_indices,
            fb.positions,
            self.backend.kv.layers[self.layer_id],
            fb.kv_indices,
            fb.kv_indptr,
            fb.kv_last_page_len,
            kv_layout="HND",
        )
        o = self.backend.forward_decode(q, self.layer_id, fb)
        return self.o_proj(o.reshape(h.shape[0], -1))

    def forward_prefill(self, h: torch.Tensor, pf: "PrefillInputs") -> torch.Tensor:
        q, k, v = self.qkv(h).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.cfg.num_heads, self.cfg.head_dim)
        k = k.view(-1, self.cfg.num_kv_heads, self.cfg.head_dim)
        v = v.view(-1, self.cfg.num_kv_heads, self.cfg.head_dim)
        flashinfer.apply_rope_pos_ids_inplace(q, k, pf.positions)
        flashinfer.append_paged_kv_cache(
            k,
            v,
            pf.batch_indices,
            pf.positions,
            self.backend.kv.layers[self.layer_id],
            pf.kv_indices,
            pf.kv_indptr,
            pf.kv_last_page_len,
            kv_layout="HND",
        )
        o = self.backend.forward_prefill(q, self.layer_id)
        return self.o_proj(o.reshape(h.shape[0], -1))


class SeedDecoder(nn.Module):
    def __init__(self, cfg: ServeConfig, backend: SeededAttnBackend):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.attn = nn.ModuleList([SeedAttention(cfg, i, backend) for i in range(cfg.num_layers)])
        self.norms = nn.ModuleList([nn.RMSNorm(cfg.hidden_size) for _ in range(cfg.num_layers)])
        self.final_norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, input_ids: torch.Tensor, fb: DecodeBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        batch_indices = torch.arange(h.shape[0], dtype=torch.int32, device=h.device)
        for norm, attn in zip(self.norms, self.attn):
            h = h + attn.forward_decode(norm(h), fb, batch_indices)
        return self.lm_head(self.final_norm(h))

    def forward_prefill(self, pf: PrefillInputs) -> torch.Tensor:
        h = self.embed(pf.input_ids)
        for norm, attn in zip(self.norms, self.attn):
            h = h + attn.forward_prefill(norm(h), pf)
        return self.lm_head(self.final_norm(h[pf.last_rows]))
