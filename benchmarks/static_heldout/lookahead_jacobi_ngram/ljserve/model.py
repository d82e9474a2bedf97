"""A Llama-style decoder whose attention goes through the lookahead backend, and its paged KV pool."""

from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from flashinfer.rope import apply_rope_pos_ids_inplace

from ljserve.attention import LookaheadAttnBackend, PromptMetadata, StepMetadata
from ljserve.config import LookaheadConfig


class PagedKVPool:
    def __init__(self, cfg: LookaheadConfig, num_pages: int, device: torch.device, dtype=torch.bfloat16):
        self.cfg = cfg
        self.page_size = cfg.page_size
        shape = (num_pages * cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        self.page_table_np = np.zeros((cfg.max_batch_size, cfg.max_pages_per_request()), dtype=np.int32)
        self.pages_held = np.zeros(cfg.max_batch_size, dtype=np.int32)
        self.free_pages: List[int] = list(range(num_pages - 1, -1, -1))

    def layer(self, layer_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
        H, D = self.cfg.num_kv_heads, self.cfg.head_dim
        return self.k[layer_id].view(-1, self.page_size, H, D), self.v[layer_id].view(-1, self.page_size, H, D)

    def store(self, layer_id: int, k: torch.Tensor, v: torch.Tensor, loc: torch.Tensor) -> None:
        self.k[layer_id][loc] = k
        self.v[layer_id][loc] = v

    def reserve(self, row: int, num_tokens: int) -> None:
        need = -(-num_tokens // self.page_size)
        while self.pages_held[row] < need:
            self.page_table_np[row, self.pages_held[row]] = self.free_pages.pop()
            self.pages_held[row] += 1

    def release(self, row: int) -> None:
        n = int(self.pages_held[row])
        self.free_pages.extend(self.page_table_np[row, :n].tolist())
        self.pages_held[row] = 0

    def rows_table(self, rows: Sequence[int]) -> np.ndarray:
        return self.page_table_np[np.asarray(rows, dtype=np.int64)]

    def slot_locs(self, rows: Sequence[int], starts: np.ndarray, count: int) -> np.ndarray:
        out = np.empty((len(rows), count), dtype=np.int64)
        offs = np.arange(count)
        for i, (row, start) in enumerate(zip(rows, starts)):
            pos = start + offs
            out[i] = self.page_table_np[row, pos // self.page_size].astype(np.int64) * self.page_size + pos % self.page_size
        return out.reshape(-1)


class LookaheadAttention(nn.Module):
    def __init__(self, cfg: LookaheadConfig, layer_id: int, backend: LookaheadAttnBackend, kv_pool: PagedKVPool):
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.kv_pool = kv_pool
        self.num_heads = cfg.num_qo_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.rope_theta = cfg.rope_theta
        q_size = cfg.num_qo_heads * cfg.head_dim
        kv_size = cfg.num_kv_heads * cfg.head_dim
        self.sizes = [q_size, kv_size, kv_size]
        self.qkv_proj = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=False)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)

    def _qkv(self, h: torch.Tensor, positions: torch.Tensor):
        q, k, v = self.qkv_proj(h).split(self.sizes, dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        apply_rope_pos_ids_inplace(q, k, positions, rope_theta=self.rope_theta)
        return q, k, v

    def forward(self, h: torch.Tensor, positions: torch.Tensor, meta: StepMetadata) -> torch.Tensor:
        q, k, v = self._qkv(h, positions)
        self.kv_pool.store(self.layer_id, k, v, meta.out_cache_loc)
        kv_cache = self.kv_pool.layer(self.layer_id)
        if meta.block_tables is not None:
            out = self.backend.forward_long(q, kv_cache, meta)
        else:
            out = self.backend.forward_verify(q, kv_cache, meta)
            if meta.num_sampling:
                rows = meta.sampling_rows
                out[rows] = self.backend.forward_plain(q[rows], kv_cache, meta)
        return self.o_proj(out.reshape(-1, self.num_heads * self.head_dim))

    def forward_prompt(self, h: torch.Tensor, positions: torch.Tensor, meta: PromptMetadata) -> torch.Tensor:
        q, k, v = self._qkv(h, positions)
        self.kv_pool.store(self.layer_id, k, v, meta.out_cache_loc)
        out = self.backend.forward_prompt(q, k, v)
        return self.o_proj(out.reshape(-1, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_up = nn.Linear(hidden, 2 * inter, bias=False)
        self.down = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LookaheadConfig, layer_id: int, backend: LookaheadAttnBackend, kv_pool: PagedKVPool):
        super().__init__()
        self.attn = LookaheadAttention(cfg, layer_id, backend, kv_pool)
        self.mlp = MLP(cfg.hidden_size, cfg.hidden_size * 7 // 2)
        self.ln1 = nn.RMSNorm(cfg.hidden_size)
        self.ln2 = nn.RMSNorm(cfg.hidden_size)

    def forward(self, h: torch.Tensor, positions: torch.Tensor, meta: StepMetadata) -> torch.Tensor:
        h = h + self.attn(self.ln1(h), positions, meta)
        return h + self.mlp(self.ln2(h))

    def forward_prompt(self, h: torch.Tensor, positions: torch.Tensor, meta: PromptMetadata) -> torch.Tensor:
        h = h + self.attn.forward_prompt(self.ln1(h), positions, meta)
        return h + self.mlp(self.ln2(h))


class LookaheadLM(nn.Module):
    def __init__(self, cfg: LookaheadConfig, backend: LookaheadAttnBackend, kv_pool: PagedKVPool):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i, backend, kv_pool) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_lookahead(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: StepMetadata) -> torch.Tensor:
        h = self.embed(input_ids.reshape(-1))
        pos = positions.reshape(-1)
        for layer in self.layers:
            h = layer(h, pos, meta)
        return self.lm_head(self.norm(h))

    def forward_prompt(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: PromptMetadata) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_prompt(h, positions, meta)
        return self.lm_head(self.norm(h[meta.last_rows]))
