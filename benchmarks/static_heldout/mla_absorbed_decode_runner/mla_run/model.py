"""A DeepSeek-shaped decoder stack with absorbed MLA decode and a non-absorbed prefill."""

from typing import List

import torch
from torch import nn

from mlaserve import AbsorbedWeights, CompressedKVPool, MLAConfig, absorb
from mla_run.attention import MLAAttention
from mla_run.metadata import MLADecodeMeta


class MLALayer(nn.Module):
    def __init__(self, cfg: MLAConfig, layer: int, attn: MLAAttention, pool: CompressedKVPool):
        super().__init__()
        self.cfg = cfg
        self.layer = layer
        self.attn = attn
        self.pool = pool
        qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        self.q_a = nn.Linear(cfg.hidden_size, cfg.q_lora_rank, bias=False)
        self.q_b = nn.Linear(cfg.q_lora_rank, cfg.num_heads * qk, bias=False)
        self.kv_a = nn.Linear(cfg.hidden_size, cfg.kv_lora_rank + cfg.qk_rope_head_dim, bias=False)
        self.kv_b = nn.Linear(cfg.kv_lora_rank, cfg.num_heads * (cfg.qk_nope_head_dim + cfg.v_head_dim), bias=False)
        self.o = nn.Linear(cfg.num_heads * cfg.v_head_dim, cfg.hidden_size, bias=False)
        self.absorbed: AbsorbedWeights = absorb(self.kv_b.weight.data, cfg)

    def _q(self, h: torch.Tensor):
        c = self.cfg
        q = self.q_b(self.q_a(h)).view(-1, c.num_heads, c.qk_nope_head_dim + c.qk_rope_head_dim)
        return q.split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)

    def _write_kv(self, h: torch.Tensor, meta: MLADecodeMeta) -> None:
        c = self.cfg
        latent = self.kv_a(h)
        ckv, kpe = latent.split([c.kv_lora_rank, c.qk_rope_head_dim], dim=-1)
        pos = meta.positions
        row = torch.arange(pos.shape[0], device=pos.device)
        page = meta.block_tables[row, pos // c.page_size]
        off = pos % c.page_size
        self.pool.ckv[self.layer][page, off] = ckv.to(self.pool.ckv[self.layer].dtype)
        self.pool.kpe[self.layer][page, off] = kpe.to(self.pool.kpe[self.layer].dtype)

    def forward(self, h: torch.Tensor, meta: MLADecodeMeta, bs: int) -> torch.Tensor:
        q_nope, q_pe = self._q(h)
        self._write_kv(h, meta)
        q_latent = torch.einsum("nhd,hdc->nhc", q_nope, self.absorbed.w_uk)
        out_latent = self.attn.forward_decode(self.layer, q_latent, q_pe, bs)
        out = torch.einsum("nhc,hcv->nhv", out_latent, self.absorbed.w_uv)
        return h + self.o(out.flatten(1))

    def forward_trtllm(self, h: torch.Tensor, meta: MLADecodeMeta) -> torch.Tensor:
        q_nope, q_pe = self._q(h)
        self._write_kv(h, meta)
        q_latent = torch.einsum("nhd,hdc->nhc", q_nope, self.absorbed.w_uk)
        q = torch.cat([q_latent, q_pe], dim=-1).unsqueeze(1)
        out_latent = self.attn.forward_decode_trtllm(self.layer, q, meta).squeeze(1)
        out = torch.einsum("nhc,hcv->nhv", out_latent, self.absorbed.w_uv)
        return h + self.o(out.flatten(1))

    def prefill(self, h: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        q_nope, q_pe = self._q(h)
        latent = self.kv_a(h)
        ckv, kpe = latent.split([c.kv_lora_rank, c.qk_rope_head_dim], dim=-1)
        kv = self.kv_b(ckv).view(-1, c.num_heads, c.qk_nope_head_dim + c.v_head_dim)
        k_nope, v = kv.split([c.qk_nope_head_dim, c.v_head_dim], dim=-1)
        k = torch.cat([k_nope, kpe.unsqueeze(1).expand(-1, c.num_heads, -1)], dim=-1)
        out = self.attn.forward_prefill(torch.cat([q_nope, q_pe], dim=-1), k, v)
        return h + self.o(out.flatten(1))


class MLAModel(nn.Module):
    def __init__(self, cfg: MLAConfig, attn: MLAAttention, pool: CompressedKVPool, vocab: int = 129280):
        super().__init__()
        self.embed = nn.Embedding(vocab, cfg.hidden_size)
        self.layers = nn.ModuleList([MLALayer(cfg, i, attn, pool) for i in range(cfg.num_layers)])
        self.head = nn.Linear(cfg.hidden_size, vocab, bias=False)

    def decode(self, ids: torch.Tensor, meta: MLADecodeMeta, bs: int) -> torch.Tensor:
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h, meta, bs)
        return self.head(h)

    def decode_trtllm(self, ids: torch.Tensor, meta: MLADecodeMeta) -> torch.Tensor:
        h = self.embed(ids)
        for layer in self.layers:
            h = layer.forward_trtllm(h, meta)
        return self.head(h)

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        layers: List[MLALayer] = list(self.layers)
        for layer in layers:
            h = layer.prefill(h)
        return self.head(h)
