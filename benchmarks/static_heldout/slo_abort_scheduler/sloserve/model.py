"""A Llama-shaped model whose attention reads the slot backend's metadata."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from flashinfer import merge_state
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from sloserve.attn import SlotAttnBackend
from sloserve.config import EngineConfig


@dataclass
class StepBatch:
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    rows: torch.Tensor
    seq_lens: torch.Tensor
    out_loc: torch.Tensor


class SlotAttention(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, attn: SlotAttnBackend, kv_cache: torch.Tensor):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.attn = attn
        self.kv_cache = kv_cache
        q, kv = cfg.num_qo_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.sizes = [q, kv, kv]
        self.qkv = nn.Linear(cfg.hidden_size, q + 2 * kv, bias=False)
        self.o = nn.Linear(q, cfg.hidden_size, bias=False)
        self.scale = cfg.head_dim ** -0.5

    def _qkv(self, h: torch.Tensor, fb: StepBatch):
        c = self.cfg
        q, k, v = self.qkv(h).split(self.sizes, dim=-1)
        q = q.view(-1, c.num_qo_heads, c.head_dim)
        k = k.view(-1, c.num_kv_heads, c.head_dim)
        v = v.view(-1, c.num_kv_heads, c.head_dim)
        page, off = fb.out_loc // c.page_size, fb.out_loc % c.page_size
        self.kv_cache[page, 0, off] = k
        self.kv_cache[page, 1, off] = v
        return q, k, v

    def decode(self, h: torch.Tensor, fb: StepBatch) -> torch.Tensor:
        q, _, _ = self._qkv(h, fb)
        w = self.attn.graph_wrappers.get(fb.batch_size, self.attn.eager_decode)
        o, lse = w.run(q, self.kv_cache, return_lse=True)  # ok: FC108
        if self.attn.system_prefix_pages is not None:
            o_sys, lse_sys = self.attn.prefix_wrapper.run(q, self.kv_cache, return_lse=True)  # expect: FC108
            o, lse = merge_state(o_sys, lse_sys, o, lse)
        return self.o(o.reshape(h.shape[0], -1))

    def extend(self, h: torch.Tensor, fb: StepBatch) -> torch.Tensor:
        q, k, v = self._qkv(h, fb)
        md = self.attn.prefill_md
        if self.attn._backend == "trtllm-gen":  # ok: FC103
            o = trtllm_batch_context_with_kv_cache(
                q,
                self.kv_cache,
                self.attn.ctx_workspace,
                self.attn.slots.page_table_gpu.index_select(0, fb.rows),
                fb.seq_lens,
                md.max_q_len,
                self.cfg.max_context_len,
                self.scale,
                1.0,
                fb.batch_size,
                md.qo_indptr,
                md.kv_cu_seqlens,
            )
            return self.o(o.reshape(h.shape[0], -1))
        o_new, lse_new = self.attn.ragged.run(q, k, v, return_lse=True)
        o_pre, lse_pre = self.attn.paged_prefill.run(q, self.kv_cache, return_lse=True)
        o, _ = merge_state(o_pre, lse_pre, o_new, lse_new)
        return self.o(o.reshape(h.shape[0], -1))


class SlotBlock(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, attn: SlotAttnBackend, kv_cache: torch.Tensor):
        super().__init__()
        self.attn = SlotAttention(cfg, layer_id, attn, kv_cache)
        self.n1 = nn.RMSNorm(cfg.hidden_size)
        self.n2 = nn.RMSNorm(cfg.hidden_size)
        self.up = nn.Linear(cfg.hidden_size, 2 * 14336, bias=False)
        self.down = nn.Linear(14336, cfg.hidden_size, bias=False)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.up(x).chunk(2, dim=-1)
        return self.down(F.silu(g) * u)

    def decode(self, h: torch.Tensor, fb: StepBatch) -> torch.Tensor:
        h = h + self.attn.decode(self.n1(h), fb)
        return h + self._mlp(self.n2(h))

    def extend(self, h: torch.Tensor, fb: StepBatch) -> torch.Tensor:
        h = h + self.attn.extend(self.n1(h), fb)
        return h + self._mlp(self.n2(h))


class SloModel(nn.Module):
    def __init__(self, cfg: EngineConfig, attn: SlotAttnBackend, num_pages: int, device: torch.device):
        super().__init__()
        shape = (num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches: List[torch.Tensor] = [
            torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)
        ]
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.blocks = nn.ModuleList([SlotBlock(cfg, i, attn, self.kv_caches[i]) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.attn = attn

    def run_step(self, fb: StepBatch, decode: bool) -> torch.Tensor:
        if decode:
            return self._decode_step(fb)
        return self._extend_step(fb)

    def _decode_step(self, fb: StepBatch) -> torch.Tensor:
        h = self.embed(fb.input_ids)
        for block in self.blocks:
            h = block.decode(h, fb)
        return self.lm_head(self.norm(h))

    def _extend_step(self, fb: StepBatch) -> torch.Tensor:
        h = self.embed(fb.input_ids)
        for block in self.blocks:
            h = block.extend(h, fb)
        last = self.attn.prefill_md.qo_indptr[1:] - 1
        return self.lm_head(self.norm(h.index_select(0, last.long())))
