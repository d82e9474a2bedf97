"""Decode engine over the quantized pool: every decode batch replays a recorded graph."""
from __future__ import annotations

import bisect
import dataclasses
from typing import Dict, List

import torch
import torch.nn as nn
from flashinfer.norm import rmsnorm

from nvfp4kv.attn.backend import QuantBatch, QuantDecodeBackend
from nvfp4kv.attn.kernels import DecodeMeta
from nvfp4kv.limits import QuantLimits
from nvfp4kv.quant import QuantKVPool, ScaleUpdateService


class QuantDecodeLayer(nn.Module):
    def __init__(self, limits: QuantLimits, layer_id: int, backend: QuantDecodeBackend, pool: QuantKVPool):
        super().__init__()
        self.limits = limits
        self.layer_id = layer_id
        self.backend = backend
        self.pool = pool
        H, KVH, D = limits.num_qo_heads, limits.num_kv_heads, limits.head_dim
        self.split = [H * D, KVH * D, KVH * D]
        self.qkv_proj = nn.Linear(limits.hidden_size, sum(self.split), bias=False)
        self.o_proj = nn.Linear(H * D, limits.hidden_size, bias=False)
        self.norm = nn.Parameter(torch.ones(limits.hidden_size))

    def forward(self, h: torch.Tensor, md: DecodeMeta) -> torch.Tensor:
        L = self.limits
        q, k, v = self.qkv_proj(rmsnorm(h, self.norm)).split(self.split, dim=-1)
        k = k.view(-1, L.num_kv_heads, L.head_dim)
        v = v.view(-1, L.num_kv_heads, L.head_dim)
        self.pool.write(self.layer_id, md.write_loc, k, v)
        o = self.backend.decode(q.view(-1, L.num_qo_heads, L.head_dim), self.layer_id, md)
        return h + self.o_proj(o.reshape(h.shape[0], -1))


class QuantDecodeStack(nn.Module):
    def __init__(self, limits: QuantLimits, backend: QuantDecodeBackend, pool: QuantKVPool):
        super().__init__()
        self.layers = nn.ModuleList([QuantDecodeLayer(limits, i, backend, pool) for i in range(limits.num_layers)])

    def forward(self, h: torch.Tensor, md: DecodeMeta) -> torch.Tensor:
        for layer in self.layers:
            h = layer(h, md)
        return h


@dataclasses.dataclass
class GraphRecord:
    graph: torch.cuda.CUDAGraph
    hidden: torch.Tensor
    out: torch.Tensor


class QuantGraphPool:
    def __init__(self, limits: QuantLimits, model: QuantDecodeStack, backend: QuantDecodeBackend, device: torch.device):
        self.limits = limits
        self.model = model
        self.backend = backend
        self.device = device
        self.buckets = sorted(limits.graph_buckets)
        self.records: Dict[int, GraphRecord] = {}
        self.mempool = None

    def bucket_for(self, n: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, n)]

    def _require_recorded(self) -> None:
        assert self.records, "warm_and_record() must run before the first replay"  # ok: FC109

    def warm_and_record(self) -> None:
        for bs in reversed(self.buckets):
            md = self.backend.dummy_metadata(bs)
            hidden = torch.zeros(bs, self.limits.hidden_size, dtype=torch.bfloat16, device=self.device)
            for _ in range(2):
                self.model(hidden, md)
            torch.cuda.current_stream().synchronize()  # ok: FC101
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.mempool):
                out = self.model(hidden, md)
            self.mempool = graph.pool()
            self.records[bs] = GraphRecord(graph=graph, hidden=hidden, out=out)

    def replay(self, batch: QuantBatch) -> torch.Tensor:
        self._require_recorded()
        n = batch.batch_size
        bs = self.bucket_for(n)
        rec = self.records.get(bs)
        self.backend.stage_replay(batch, bs)
        rec.hidden = torch.cat([batch.hidden, rec.hidden[n:]])  # expect: FC107
        rec.graph.replay()
        return rec.out[:n]


@dataclasses.dataclass
class ReqState:
    pages: List[int]
    seq_len: int


class QuantKVEngine:
    def __init__(self, limits: QuantLimits, device: str = "cuda"):
        self.limits = limits
        self.device = torch.device(device)
        major, minor = torch.cuda.get_device_capability(self.device)
        sm = major * 10 + minor
        self.pool = QuantKVPool(limits, self.device)
        self.backend = QuantDecodeBackend(limits, self.pool, self.device, sm)
        self.scale_service = ScaleUpdateService(self.pool, self.backend, interval=limits.rescale_interval)
        self.model = QuantDecodeStack(limits, self.backend, self.pool).to(self.device)
        self.graph_pool = QuantGraphPool(limits, self.model, self.backend, self.device)
        self.graph_pool.warm_and_record()
        self.requests: Dict[int, ReqState] = {}

    def add_request(self, req_id: int, prompt_pages: List[int], prompt_len: int) -> None:
        if req_id in self.requests:
            raise KeyError(f"request {req_id} is already running")
        self.requests[req_id] = ReqState(list(prompt_pages), prompt_len)

    def _make_batch(self, hidden: torch.Tensor, req_ids: List[int]) -> QuantBatch:
        P = self.limits.page_size
        locs, lens = [], []
        for r in req_ids:
            st = self.requests[r]
            if st.seq_len % P == 0:
                st.pages.extend(self.pool.alloc(1))
            locs.append(st.pages[st.seq_len // P] * P + st.seq_len % P)
            st.seq_len += 1
            lens.append(st.seq_len)
        width = max(len(self.requests[r].pages) for r in req_ids)
        table = torch.zeros(len(req_ids), width, dtype=torch.int32)
        for i, r in enumerate(req_ids):
            pages = self.requests[r].pages
            table[i, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        lens_cpu = torch.tensor(lens, dtype=torch.int32)
        return QuantBatch(
            batch_size=len(req_ids),
            hidden=hidden,
            seq_lens=lens_cpu.to(self.device, non_blocking=True),
            seq_lens_cpu=lens_cpu,
            block_table_cpu=table,
            write_loc=torch.tensor(locs, dtype=torch.int64).to(self.device, non_blocking=True),
        )

    def decode_step(self, hidden: torch.Tensor, req_ids: List[int]) -> torch.Tensor:
        if len(req_ids) > self.limits.max_batch_size:
            raise ValueError(f"{len(req_ids)} requests > max_batch_size={self.limits.max_batch_size}")
        batch = self._make_batch(hidden, req_ids)
        out = self.graph_pool.replay(batch)
        self.scale_service.on_step()
        return out

    def status(self) -> Dict[str, object]:
        return {
            "kv_format": self.pool.fmt,
            "scale_backend": self.scale_service._backend,  # ok: FC103
            "running": len(self.requests),
            "last_amax": self.scale_service.last_amax_seen,
        }
