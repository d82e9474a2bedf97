"""The decoder, the decode/extend step factories, and the decode graphs per batch bucket (the token bitmask is
applied inside the graph) and per jump-forward bucket."""

from __future__ import annotations

import bisect
from typing import Dict, List, Optional

import numpy as np
import torch
import xgrammar as xgr
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from torch import nn

from gbserve.backend import DecodeBatch, GBAttnBackend, PrefillBatch
from gbserve.config import GBConfig


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 1000000.0) -> torch.Tensor:
    half = x.shape[-1] // 2
    inv = theta ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    ang = positions.float()[:, None, None] * inv
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * ang.cos() - x2 * ang.sin(), x1 * ang.sin() + x2 * ang.cos()], -1).to(x.dtype)


class GBLayer(nn.Module):
    def __init__(self, cfg: GBConfig):
        super().__init__()
        self.cfg = cfg
        q_size, kv_size = cfg.num_qo_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.ln1 = nn.RMSNorm(cfg.hidden_size)
        self.ln2 = nn.RMSNorm(cfg.hidden_size)
        self.qkv = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=True)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)
        self.gate_up = nn.Linear(cfg.hidden_size, 8 * cfg.hidden_size, bias=False)
        self.down = nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.sizes = [q_size, kv_size, kv_size]

    def qkv_rope(self, h: torch.Tensor, positions: torch.Tensor):
        q, k, v = self.qkv(self.ln1(h)).split(self.sizes, dim=-1)
        q = rope(q.view(-1, self.cfg.num_qo_heads, self.cfg.head_dim), positions)
        k = rope(k.view(-1, self.cfg.num_kv_heads, self.cfg.head_dim), positions)
        return q, k, v.view(-1, self.cfg.num_kv_heads, self.cfg.head_dim)

    def finish(self, h: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        h = h + self.o_proj(attn_out.flatten(1))
        g, u = self.gate_up(self.ln2(h)).chunk(2, dim=-1)
        return h + self.down(nn.functional.silu(g) * u)


class GBDecoder(nn.Module):
    def __init__(self, cfg: GBConfig):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([GBLayer(cfg) for _ in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h)).float()

    def prefill(
        self, input_ids: torch.Tensor, positions: torch.Tensor, last_idx: torch.Tensor,
        backend: GBAttnBackend, batch: PrefillBatch,
    ) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, backend.kv_caches):
            q, k, v = layer.qkv_rope(h, positions)
            backend.store_kv(kv, k, v)
            h = layer.finish(h, backend.forward_prefill(q, kv, batch))
        return self.logits(h.index_select(0, last_idx))


def make_decode_step(wrapper: BatchDecodeWithPagedKVCacheWrapper, model: GBDecoder, backend: GBAttnBackend):
    def step(input_ids: torch.Tensor, positions: torch.Tensor, bitmask: Optional[torch.Tensor]) -> torch.Tensor:
        h = model.embed(input_ids)
        for layer, kv in zip(model.layers, backend.kv_caches):
            q, k, v = layer.qkv_rope(h, positions)
            backend.store_kv(kv, k, v)
            h = layer.finish(h, wrapper.run(q, kv))  # ok: FC108
        logits = model.logits(h)
        if bitmask is not None:
            xgr.apply_token_bitmask_inplace(logits, bitmask)
        return logits

    return step


def make_extend_step(wrapper: BatchPrefillWithPagedKVCacheWrapper, model: GBDecoder, backend: GBAttnBackend):
    def extend(input_ids: torch.Tensor, positions: torch.Tensor, last_idx: torch.Tensor) -> torch.Tensor:
        h = model.embed(input_ids)
        for layer, kv in zip(model.layers, backend.kv_caches):
            q, k, v = layer.qkv_rope(h, positions)
            backend.store_kv(kv, k, v)
            h = layer.finish(h, wrapper.run(q, kv))  # expect: FC108
        return model.logits(h.index_select(0, last_idx))

    return extend


class DecodeGraph:
    def __init__(self, model: GBDecoder, backend: GBAttnBackend, cfg: GBConfig):
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.device = backend.device
        self.buckets: List[int] = sorted(cfg.graph_buckets)
        self.jump_buckets: List[int] = sorted(cfg.jump_buckets)
        self.max_bucket = self.buckets[-1]
        max_bs, k = self.max_bucket, cfg.max_jump_tokens
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self.static_bitmask = torch.full((max_bs, cfg.bitmask_words), -1, dtype=torch.int32, device=self.device)
        self.allow_all_rows: Optional[torch.Tensor] = None
        self.jump_ids = torch.zeros(max_bs * k, dtype=torch.int64, device=self.device)
        self.jump_positions = torch.zeros(max_bs * k, dtype=torch.int64, device=self.device)
        self.jump_last_idx = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.jump_graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.jump_outputs: Dict[int, torch.Tensor] = {}
        self.pool = None

    def pick(self, bs: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, bs)]

    def _dummy_extend(self, bs: int, k: int) -> PrefillBatch:
        ps = self.cfg.page_size
        pages_per_req = -(-k // ps)
        return PrefillBatch(
            num_reqs=bs,
            extend_lens_np=np.full(bs, k, dtype=np.int32),
            seq_lens_np=np.full(bs, k, dtype=np.int32),
            kv_indptr_np=np.arange(0, (bs + 1) * pages_per_req, pages_per_req, dtype=np.int32),
            kv_indices_np=np.zeros(bs * pages_per_req, dtype=np.int32),
            last_page_len_np=np.full(bs, (k - 1) % ps + 1, dtype=np.int32),
            slot_mapping_np=np.zeros(bs * k, dtype=np.int64),
            block_tables_np=np.zeros((bs, pages_per_req), dtype=np.int32),
        )

    def capture_bucket(self, bs: int) -> None:
        self.backend.warm_plan(bs)
        step = make_decode_step(self.backend.graph_wrappers[bs], self.model, self.backend)
        ids, pos, mask = self.input_ids[:bs], self.positions[:bs], self.static_bitmask[:bs]
        step(ids, pos, mask)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = step(ids, pos, mask)
        self.pool = graph.pool()
        self.graphs[bs] = graph
        self.outputs[bs] = out

    def capture_jump_bucket(self, bs: int) -> None:
        k = self.cfg.max_jump_tokens
        self.backend.plan_jump_extend(self._dummy_extend(bs, k))
        extend = make_extend_step(self.backend.jump_prefill_wrapper, self.model, self.backend)
        ids, pos, last = self.jump_ids[: bs * k], self.jump_positions[: bs * k], self.jump_last_idx[:bs]
        extend(ids, pos, last)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = extend(ids, pos, last)
        self.jump_graphs[bs] = graph
        self.jump_outputs[bs] = out

    def capture_all(self) -> None:
        for bs in reversed(self.buckets):
            self.capture_bucket(bs)
        for bs in reversed(self.jump_buckets):
            self.capture_jump_bucket(bs)

    def replay(
        self, batch: DecodeBatch, input_ids: torch.Tensor, positions: torch.Tensor, bitmask_cpu: torch.Tensor
    ) -> torch.Tensor:
        bs = batch.num_reqs
        padded = self.pick(bs)
        self.backend.load_decode_inputs(bs, padded, batch)
        self.input_ids[:bs].copy_(input_ids, non_blocking=True)
        self.positions[:bs].copy_(positions, non_blocking=True)
        if self.allow_all_rows is None:
            self.allow_all_rows = torch.full((self.max_bucket, self.cfg.bitmask_words), -1, dtype=torch.int32, device=self.device)  # ok: FC107
        bitmask_gpu = bitmask_cpu.to(self.device, non_blocking=True)
        self.static_bitmask = torch.cat([bitmask_gpu, self.allow_all_rows[: padded - bs]])  # expect: FC107
        self.graphs[padded].replay()
        return self.outputs[padded][:bs]
