"""A Llama-style decoder whose attention runs Ulysses-style on the local head shard."""
from __future__ import annotations

import torch
from torch import nn

from flashinfer.page import append_paged_kv_cache

from ulysses_sp.attn.backend import UlyssesFlashInferBackend
from ulysses_sp.batch import ForwardBatch, UlyssesPrefillMeta
from ulysses_sp.comm.seq_all_to_all import SeqAllToAll
from ulysses_sp.config import SPConfig


class UlyssesAttention(nn.Module):
    def __init__(self, layer_id: int, cfg: SPConfig, backend: UlyssesFlashInferBackend, a2a: SeqAllToAll):
        super().__init__()
        self.layer_id = layer_id
        self.cfg = cfg
        self.backend = backend
        self.a2a = a2a
        h, kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, (h + 2 * kv) * d, bias=False)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)

    def _project(self, hidden: torch.Tensor):
        cfg = self.cfg
        h, kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        qkv = self.qkv_proj(hidden)
        q, k, v = qkv.split([h * d, kv * d, kv * d], dim=-1)
        return q.view(-1, h, d), k.view(-1, kv, d), v.view(-1, kv, d)

    def forward_prefill(self, hidden, kv_cache, meta: UlyssesPrefillMeta) -> torch.Tensor:
        q, k, v = self._project(hidden)
        q = self.a2a.seq_to_head(q, meta.send_counts, meta.recv_counts)
        k = self.a2a.seq_to_head(k, meta.send_counts, meta.recv_counts)
        v = self.a2a.seq_to_head(v, meta.send_counts, meta.recv_counts)
        append_paged_kv_cache(
            k, v, meta.batch_indices, meta.positions, kv_cache, meta.new_page_ids, meta.new_kv_indptr,
            meta.new_last_page_len,
        )
        o = self.backend.forward_prefill(q, k, v, kv_cache, meta)
        o = self.a2a.head_to_seq(o, meta.send_counts, meta.recv_counts)
        return self.o_proj(o.flatten(1))

    def _exchange_and_append(self, hidden, kv_cache, fb: ForwardBatch) -> torch.Tensor:
        q, k, v = self._project(hidden)
        q = self.a2a.decode_seq_to_head(q)
        k = self.a2a.decode_seq_to_head(k)
        v = self.a2a.decode_seq_to_head(v)
        append_paged_kv_cache(
            k, v, fb.batch_indices, fb.positions, kv_cache, fb.kv_indices, fb.kv_indptr, fb.kv_last_page_len
        )
        return q

    def forward_decode(self, hidden, kv_cache, fb: ForwardBatch) -> torch.Tensor:
        q = self._exchange_and_append(hidden, kv_cache, fb)
        o = self.backend.forward_decode(q, kv_cache, fb)
        return self.o_proj(self.a2a.decode_head_to_seq(o).flatten(1))

    def forward_extend(self, hidden, kv_cache, fb: ForwardBatch) -> torch.Tensor:
        q = self._exchange_and_append(hidden, kv_cache, fb)
        o = self.backend.forward_extend(q, kv_cache, fb)
        return self.o_proj(self.a2a.decode_head_to_seq(o).flatten(1))


class DecoderLayer(nn.Module):
    def __init__(self, layer_id, cfg, backend, a2a):
        super().__init__()
        self.attn = UlyssesAttention(layer_id, cfg, backend, a2a)
        self.norm1 = nn.RMSNorm(cfg.hidden_size)
        self.norm2 = nn.RMSNorm(cfg.hidden_size)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size, bias=False),
            nn.SiLU(),
            nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False),
        )

    def forward_prefill(self, h, kv_cache, meta):
        h = h + self.attn.forward_prefill(self.norm1(h), kv_cache, meta)
        return h + self.mlp(self.norm2(h))

    def forward_decode(self, h, kv_cache, fb):
        h = h + self.attn.forward_decode(self.norm1(h), kv_cache, fb)
        return h + self.mlp(self.norm2(h))

    def forward_extend(self, h, kv_cache, fb):
        h = h + self.attn.forward_extend(self.norm1(h), kv_cache, fb)
        return h + self.mlp(self.norm2(h))


class UlyssesLlama(nn.Module):
    def __init__(self, cfg: SPConfig, backend: UlyssesFlashInferBackend, a2a: SeqAllToAll, vocab: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(i, cfg, backend, a2a) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, vocab, bias=False)

    def forward_prefill(self, input_ids, kv_caches, meta: UlyssesPrefillMeta) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer.forward_prefill(h, kv, meta)
        return self.lm_head(self.norm(h))

    def forward_decode(self, input_ids, kv_caches, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer.forward_decode(h, kv, fb)
        return self.lm_head(self.norm(h))

    def forward_extend(self, input_ids, kv_caches, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer.forward_extend(h, kv, fb)
        return self.lm_head(self.norm(h))
