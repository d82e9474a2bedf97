"""Model runner and decode graph runner of a context-parallel rank."""
from __future__ import annotations

import bisect
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from flashinfer.norm import rmsnorm
from flashinfer.rope import apply_rope_pos_ids

from cpring.attention import CPDecodeBackend, RingPrefillAttention
from cpring.attention.decode_backend import CPConfig
from cpring.forward_batch import CPForwardBatch, ForwardMode
from cpring.kv_pool import ShardKVPool
from cpring.parallel.layout import padded_len, zigzag_bounds
from cpring.parallel.ring_comm import RingComm


class CPLayer(nn.Module):
    def __init__(self, cfg: CPConfig, layer_id: int, attn_backend: CPDecodeBackend,
                 ring_attn: RingPrefillAttention, pool: ShardKVPool):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.attn_backend = attn_backend
        self.ring_attn = ring_attn
        self.pool = pool
        H, KVH, D = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.split = [H * D, KVH * D, KVH * D]
        self.qkv_proj = nn.Linear(cfg.hidden_size, sum(self.split), bias=False)
        self.o_proj = nn.Linear(H * D, cfg.hidden_size, bias=False)
        self.mlp_in = nn.Linear(cfg.hidden_size, 2 * 4 * cfg.hidden_size, bias=False)
        self.mlp_out = nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.norm1 = nn.Parameter(torch.ones(cfg.hidden_size))
        self.norm2 = nn.Parameter(torch.ones(cfg.hidden_size))

    def _qkv(self, h: torch.Tensor, positions: torch.Tensor):
        c = self.cfg
        q, k, v = self.qkv_proj(rmsnorm(h, self.norm1)).split(self.split, dim=-1)
        q, k = apply_rope_pos_ids(
            q.view(-1, c.num_qo_heads, c.head_dim), k.view(-1, c.num_kv_heads, c.head_dim), positions
        )
        return q, k, v.view(-1, c.num_kv_heads, c.head_dim)

    def _store(self, kv: torch.Tensor, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        P = self.cfg.page_size
        kv[loc // P, 0, loc % P] = k
        kv[loc // P, 1, loc % P] = v

    def _finish(self, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        h = h + self.o_proj(o.reshape(h.shape[0], -1))
        gate, up = self.mlp_in(rmsnorm(h, self.norm2)).chunk(2, dim=-1)
        return h + self.mlp_out(F.silu(gate) * up)

    def extend(self, h: torch.Tensor, fb: CPForwardBatch) -> torch.Tensor:
        q, k, v = self._qkv(h, fb.positions)
        self._store(self.pool.shard_kv[self.layer_id], fb.out_cache_loc, k, v)
        return self._finish(h, self.ring_attn.forward(q, k, v))

    def decode(self, h: torch.Tensor, fb: CPForwardBatch) -> torch.Tensor:
        q, k, v = self._qkv(h, fb.positions)
        self._store(self.pool.tail_kv[self.layer_id], fb.out_cache_loc, k, v)
        return self._finish(h, self.attn_backend.forward_decode(q, self.layer_id))


class CPModel(nn.Module):
    def __init__(self, cfg: CPConfig, attn_backend: CPDecodeBackend, ring_attn: RingPrefillAttention, pool: ShardKVPool):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            [CPLayer(cfg, i, attn_backend, ring_attn, pool) for i in range(cfg.num_layers)]
        )
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def extend(self, fb: CPForwardBatch) -> torch.Tensor:
        h = self.embed(fb.input_ids)
        for layer in self.layers:
            h = layer.extend(h, fb)
        return self.lm_head(rmsnorm(h, self.norm))

    def decode(self, fb: CPForwardBatch) -> torch.Tensor:
        h = self.embed(fb.input_ids)
        for layer in self.layers:
            h = layer.decode(h, fb)
        return self.lm_head(rmsnorm(h, self.norm))


class CPModelRunner:
    def __init__(self, cfg: CPConfig, group: dist.ProcessGroup, device: torch.device, pad_token_id: int = 0):
        self.cfg = cfg
        self.device = device
        self.pad_token_id = pad_token_id
        self.comm = RingComm(group, device)
        self.pool = ShardKVPool(cfg.num_layers, cfg.shard_pages, cfg.tail_pages, cfg.page_size, cfg.num_kv_heads,
                                cfg.head_dim, cfg.max_running_requests, cfg.max_pages_per_req, device)
        self.ring_attn = RingPrefillAttention(self.comm, cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, device)
        self.attn_backend = CPDecodeBackend(cfg, self.pool, self.comm, self.ring_attn, device)
        self.model = CPModel(cfg, self.attn_backend, self.ring_attn, self.pool).to(device)
        self.graph_runner = CudaGraphRunner(self)
        self.graph_runner.capture()

    def _dev(self, xs, dtype=torch.int64) -> torch.Tensor:
        return torch.tensor(xs, dtype=dtype).to(self.device, non_blocking=True)

    def make_extend_batch(self, reqs: List[Tuple[int, List[int]]]) -> CPForwardBatch:
        cp, rank = self.comm.world, self.comm.rank
        ids, pos, locs, local_lens, seq_lens, pool_idx = [], [], [], [], [], []
        for req, prompt in reqs:
            n = padded_len(len(prompt), cp)
            tokens = prompt + [self.pad_token_id] * (n - len(prompt))
            (a, b), (c, d) = zigzag_bounds(n, cp, rank)
            mine = list(range(a, b)) + list(range(c, d))
            ids.extend(tokens[i] for i in mine)
            pos.extend(mine)
            locs.extend(self.pool.alloc_prompt(req, len(prompt), len(mine)).tolist())
            local_lens.append(len(mine))
            seq_lens.append(n)
            pool_idx.append(req)
        return CPForwardBatch(
            forward_mode=ForwardMode.EXTEND, batch_size=len(reqs), input_ids=self._dev(ids),
            positions=self._dev(pos), req_pool_indices=self._dev(pool_idx), req_pool_indices_cpu=pool_idx,
            seq_lens=self._dev(seq_lens, torch.int32), seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int32),
            local_lens=self._dev(local_lens, torch.int32), local_lens_cpu=local_lens, out_cache_loc=self._dev(locs),
        )

    def make_decode_batch(self, reqs: List[int], seq_lens: List[int], next_ids: torch.Tensor) -> CPForwardBatch:
        locs = [self.pool.alloc_tail_slot(r, n) for r, n in zip(reqs, seq_lens)]
        return CPForwardBatch(
            forward_mode=ForwardMode.DECODE, batch_size=len(reqs), input_ids=next_ids,
            positions=self._dev([n - 1 for n in seq_lens]), req_pool_indices=self._dev(reqs),
            req_pool_indices_cpu=list(reqs), seq_lens=self._dev(seq_lens, torch.int32),
            seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int32), local_lens=self._dev([1] * len(reqs), torch.int32),
            local_lens_cpu=[1] * len(reqs), out_cache_loc=self._dev(locs),
        )

    def forward(self, fb: CPForwardBatch) -> torch.Tensor:
        if fb.forward_mode == ForwardMode.DECODE and self.graph_runner.can_run(fb.batch_size):
            return self.graph_runner.replay(fb)
        self.attn_backend.init_forward_metadata(fb)
        if fb.forward_mode == ForwardMode.EXTEND:
            return self.forward_extend(fb)
        return self.model.decode(fb)

    def forward_extend(self, fb: CPForwardBatch) -> torch.Tensor:
        logits = self.model.extend(fb)
        self._prime_decode_table(fb)
        return logits

    def _prime_decode_table(self, fb: CPForwardBatch) -> None:
        """Leave the new requests' shard offsets in place so their first decode skips the upload."""
        kv_indptr = self.attn_backend.kv_indptr
        pages = (fb.local_lens + self.cfg.page_size - 1) // self.cfg.page_size
        torch.cumsum(pages, 0, dtype=torch.int32, out=kv_indptr[1 : fb.batch_size + 1])  # expect: FC104


class CudaGraphRunner:
    def __init__(self, model_runner: CPModelRunner):
        self.model_runner = model_runner
        self.attn_backend = model_runner.attn_backend
        cfg = model_runner.cfg
        self.capture_bs = sorted(cfg.cuda_graph_bs)
        max_bs = self.capture_bs[-1]
        device = model_runner.device
        self.attn_backend.init_cuda_graph_state(max_bs)
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.req_pool_indices = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.out_cache_loc = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.logits_buf = torch.zeros(max_bs, cfg.vocab_size, dtype=torch.bfloat16, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None

    def can_run(self, bs: int) -> bool:
        return bs <= self.capture_bs[-1]

    def capture(self) -> None:
        for bs in reversed(self.capture_bs):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        self.attn_backend.init_forward_metadata_capture_cuda_graph(bs)
        fb = CPForwardBatch(
            forward_mode=ForwardMode.DECODE, batch_size=bs, input_ids=self.input_ids[:bs],
            positions=self.positions[:bs], req_pool_indices=self.req_pool_indices[:bs],
            req_pool_indices_cpu=list(range(bs)), seq_lens=self.seq_lens[:bs],
            seq_lens_cpu=torch.ones(bs, dtype=torch.int32), local_lens=self.seq_lens[:bs],
            local_lens_cpu=[1] * bs, out_cache_loc=self.out_cache_loc[:bs],
        )
        model = self.model_runner.model

        def run_once() -> None:
            self.logits_buf[:bs] = model.decode(fb)

        for _ in range(2):
            run_once()
        self.model_runner.comm.comm_stream.synchronize()  # ok: FC101
        if torch.isnan(self.logits_buf[:bs]).any():  # expect: FC101
            raise RuntimeError(f"NaN logits in the bs={bs} warm-up")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            run_once()
        self.pool = graph.pool()
        self.graphs[bs] = graph

    def replay(self, fb: CPForwardBatch) -> torch.Tensor:
        raw_bs = fb.batch_size
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
        self.input_ids[:raw_bs].copy_(fb.input_ids)
        self.positions[:raw_bs].copy_(fb.positions)
        self.seq_lens[:raw_bs].copy_(fb.seq_lens)
        self.out_cache_loc = fb.out_cache_loc.clone()  # expect: FC107
        self.attn_backend.init_forward_metadata_replay_cuda_graph(
            bs, fb.req_pool_indices_cpu, fb.seq_lens, fb.seq_lens_cpu
        )
        self.graphs[bs].replay()
        return self.logits_buf[:raw_bs]
