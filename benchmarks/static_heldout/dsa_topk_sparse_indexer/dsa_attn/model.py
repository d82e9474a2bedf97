"""A DeepSeek-V3.2-shaped decoder: absorbed MLA, dense first layers, sparse after."""

from __future__ import annotations

import torch
from torch import nn

from dsa.batch import DecodeBatch, ExtendBatch
from dsa.config import DSAConfig
from dsa.kv_cache import MLATokenPool

from .backend import DSAAttnBackend


class DSAAttention(nn.Module):
    def __init__(self, cfg: DSAConfig, layer_id: int, backend: DSAAttnBackend, pool: MLATokenPool):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.sparse = layer_id >= cfg.first_sparse_layer
        self.backend = backend
        self.pool = pool
        h = cfg.num_heads
        self.q_proj = nn.Linear(cfg.hidden_size, h * cfg.qk_head_dim, bias=False)
        self.kv_a_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim, bias=False)
        self.w_kc = nn.Parameter(torch.empty(h, cfg.qk_nope_head_dim, cfg.kv_lora_rank))
        self.w_vc = nn.Parameter(torch.empty(h, cfg.kv_lora_rank, cfg.v_head_dim))
        self.o_proj = nn.Linear(h * cfg.v_head_dim, cfg.hidden_size, bias=False)

    def _q(self, h: torch.Tensor):
        q = self.q_proj(h).view(h.shape[0], self.cfg.num_heads, self.cfg.qk_head_dim)
        return q.split([self.cfg.qk_nope_head_dim, self.cfg.qk_rope_head_dim], dim=-1)

    def forward_decode(self, h: torch.Tensor, fb: DecodeBatch) -> torch.Tensor:
        q_nope, q_pe = self._q(h)
        q_nope = torch.einsum("bhd,hdr->bhr", q_nope, self.w_kc)
        self.pool.write_latent(fb.out_cache_loc, self.kv_a_proj(h))
        if self.sparse:
            o = self.backend.forward_sparse(q_nope, q_pe, fb)
        else:
            o = self.backend.forward_dense(q_nope, q_pe, fb)
        o = torch.einsum("bhr,hrv->bhv", o, self.w_vc)
        return self.o_proj(o.flatten(1))

    def forward_extend(self, h: torch.Tensor, eb: ExtendBatch) -> torch.Tensor:
        q_nope, q_pe = self._q(h)
        latent = self.kv_a_proj(h)
        self.pool.write_latent(eb.out_cache_loc, latent)
        ckv = latent[:, : self.cfg.kv_lora_rank]
        k_nope = torch.einsum("tr,hdr->thd", ckv, self.w_kc)
        k_pe = latent[:, None, self.cfg.kv_lora_rank :].expand(-1, self.cfg.num_heads, -1)
        v = torch.einsum("tr,hrv->thv", ckv, self.w_vc)
        q = torch.cat([q_nope, q_pe], dim=-1)
        k = torch.cat([k_nope, k_pe], dim=-1)
        o = self.backend.forward_extend(q, k, v)
        return self.o_proj(o.flatten(1))


class DSALayer(nn.Module):
    def __init__(self, cfg: DSAConfig, layer_id: int, backend: DSAAttnBackend, pool: MLATokenPool):
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.hidden_size)
        self.attn = DSAAttention(cfg, layer_id, backend, pool)
        self.mlp_norm = nn.RMSNorm(cfg.hidden_size)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size, bias=False),
            nn.SiLU(),
            nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False),
        )

    def forward_decode(self, h: torch.Tensor, fb: DecodeBatch) -> torch.Tensor:
        h = h + self.attn.forward_decode(self.attn_norm(h), fb)
        return h + self.mlp(self.mlp_norm(h))

    def forward_extend(self, h: torch.Tensor, eb: ExtendBatch) -> torch.Tensor:
        h = h + self.attn.forward_extend(self.attn_norm(h), eb)
        return h + self.mlp(self.mlp_norm(h))


class DSAModel(nn.Module):
    def __init__(self, cfg: DSAConfig, backend: DSAAttnBackend, pool: MLATokenPool):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DSALayer(cfg, i, backend, pool) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, fb: DecodeBatch) -> torch.Tensor:
        h = self.embed(fb.input_ids)
        for layer in self.layers:
            h = layer.forward_decode(h, fb)
        return self.lm_head(self.norm(h))

    def forward_extend(self, eb: ExtendBatch) -> torch.Tensor:
        h = self.embed(eb.input_ids)
        for layer in self.layers:
            h = layer.forward_extend(h, eb)
        return h
