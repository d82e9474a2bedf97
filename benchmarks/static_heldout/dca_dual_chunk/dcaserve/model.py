"""A Qwen2-shaped decoder whose attention is dual chunk attention over a paged KV cache."""

from __future__ import annotations

from typing import List

import torch
import torch.nn as nn
import torch.nn.functional as F
from flashinfer import merge_state
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from dcaserve.backend import DualChunkBackend
from dcaserve.batch import DCAForwardBatch
from dcaserve.config import DCAConfig
from dcaserve.ops.rope_variants import apply_dca_rope, apply_key_rope, build_cos_sin_cache


class DCAKVCache:
    """Per-layer paged K/V, ``[num_pages, 2, page_size, num_kv_heads, head_dim]``."""

    def __init__(self, cfg: DCAConfig, num_pages: int, device: torch.device):
        self.page_size = cfg.page_size
        shape = (num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.layers: List[torch.Tensor] = [
            torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)
        ]

    def store(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        buf = self.layers[layer_id]
        page, off = loc // self.page_size, loc % self.page_size
        buf[page, 0, off] = k
        buf[page, 1, off] = v
        return buf


class DCAAttention(nn.Module):
    def __init__(self, cfg: DCAConfig, layer_id: int, backend: DualChunkBackend, kv: DCAKVCache):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.backend = backend
        self.kv = kv
        self.q_size = cfg.num_qo_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = nn.Linear(4096, self.q_size + 2 * self.kv_size, bias=True)
        self.o_proj = nn.Linear(self.q_size, 4096, bias=False)
        self.scale = cfg.head_dim ** -0.5
        self.register_buffer(
            "cos_sin_cache",
            build_cos_sin_cache(cfg.chunk_size + cfg.local_size, cfg.head_dim, cfg.rope_theta, torch.device("cpu")),
            persistent=False,
        )

    def _project(self, hidden: torch.Tensor, fb: DCAForwardBatch):
        c = self.cfg
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, c.num_qo_heads, c.head_dim)
        k = apply_key_rope(k.view(-1, c.num_kv_heads, c.head_dim), fb.key_pos, self.cos_sin_cache)
        v = v.view(-1, c.num_kv_heads, c.head_dim)
        kv_cache = self.kv.store(self.layer_id, fb.out_cache_loc, k, v)
        return q, k, v, kv_cache

    def decode(self, hidden: torch.Tensor, fb: DCAForwardBatch) -> torch.Tensor:
        c = self.cfg
        md = self.backend.forward_metadata
        bs = md.batch_size
        q, _, _, kv_cache = self._project(hidden, fb)
        q_intra, q_succ, q_inter = apply_dca_rope(
            q, fb.intra_pos, self.backend.inter_positions[:bs], self.cos_sin_cache, c.chunk_size, c.local_size
        )
        o_intra, s_intra = md.decode["intra"].run(q_intra, kv_cache, return_lse=True)  # ok: FC108
        o_succ, s_succ = md.decode["succ"].run(q_succ, kv_cache, return_lse=True)
        o_inter, s_inter = self.backend.inter_decode.run(q_inter, kv_cache, return_lse=True)  # expect: FC108
        o, s = merge_state(o_intra, s_intra, o_succ, s_succ)
        has_succ = self.backend.row_chunk[:bs] > 0
        o = torch.where(has_succ[:, None, None], o, o_intra)
        s = torch.where(has_succ[:, None], s, s_intra)
        o, _ = merge_state(o, s, o_inter, s_inter)
        return self.o_proj(o.reshape(bs, -1))

    def extend(self, hidden: torch.Tensor, fb: DCAForwardBatch) -> torch.Tensor:
        c = self.cfg
        md = self.backend.forward_metadata
        q, k, v, kv_cache = self._project(hidden, fb)
        if md.first_chunk_only:
            o = trtllm_batch_context_with_kv_cache(
                q,
                kv_cache,
                self.backend.trtllm_workspace,
                self.backend.page_table.block_table[fb.slots],
                fb.seq_lens,
                fb.max_q_len,
                fb.max_kv_len,
                self.scale,
                1.0,
                fb.batch_size,
                fb.qo_indptr,
                fb.kv_cu_seqlens,
            )
            return self.o_proj(o.reshape(q.shape[0], -1))
        q_intra, q_succ, q_inter = apply_dca_rope(
            q, fb.intra_pos, fb.inter_pos, self.cos_sin_cache, c.chunk_size, c.local_size
        )
        o, s = self.backend.ragged_wrapper.run(q_intra, k, v, return_lse=True)
        for name, q_rot in (("succ", q_succ), ("inter", q_inter)):
            o_part, s_part = md.prefill_streams[name].run(q_rot, kv_cache, return_lse=True)
            o, s = merge_state(o, s, o_part, s_part)
        return self.o_proj(o.reshape(q.shape[0], -1))


class DCADecoderLayer(nn.Module):
    def __init__(self, cfg: DCAConfig, layer_id: int, backend: DualChunkBackend, kv: DCAKVCache):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(4096, eps=1e-6)
        self.post_attention_layernorm = nn.RMSNorm(4096, eps=1e-6)
        self.self_attn = DCAAttention(cfg, layer_id, backend, kv)
        self.gate_up = nn.Linear(4096, 2 * 18944, bias=False)
        self.down = nn.Linear(18944, 4096, bias=False)

    def _mlp(self, h: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(h).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)

    def decode(self, h: torch.Tensor, fb: DCAForwardBatch) -> torch.Tensor:
        h = h + self.self_attn.decode(self.input_layernorm(h), fb)
        return h + self._mlp(self.post_attention_layernorm(h))

    def extend(self, h: torch.Tensor, fb: DCAForwardBatch) -> torch.Tensor:
        h = h + self.self_attn.extend(self.input_layernorm(h), fb)
        return h + self._mlp(self.post_attention_layernorm(h))


class DCAModel(nn.Module):
    """Entry points are split by mode: the decode graphs capture ``forward_decode`` only."""

    def __init__(self, cfg: DCAConfig, backend: DualChunkBackend, kv: DCAKVCache):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, 4096)
        self.layers = nn.ModuleList([DCADecoderLayer(cfg, i, backend, kv) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(4096, eps=1e-6)
        self.lm_head = nn.Linear(4096, cfg.vocab_size, bias=False)

    def forward_decode(self, input_ids: torch.Tensor, fb: DCAForwardBatch) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer.decode(h, fb)
        return self.lm_head(self.norm(h))

    def forward_extend(self, input_ids: torch.Tensor, fb: DCAForwardBatch) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer.extend(h, fb)
        last = torch.from_numpy(fb.qo_indptr_np[1:] - 1).to(h.device, non_blocking=True)
        return self.lm_head(self.norm(h.index_select(0, last)))
