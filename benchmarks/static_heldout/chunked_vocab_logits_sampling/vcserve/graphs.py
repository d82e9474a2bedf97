"""Decode graphs per bucket: the body, the chunked head, the merge and the sampler are all captured."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from vcserve.attention import SinkDecodeAttention
from vcserve.kv import DecodeBatch, dummy_decode_batch
from vcserve.model import ChunkLM
from vcserve.sampler import ChunkedSampler
from vocabchunk.params import PenaltyEntries, SamplingTensors
from vocabchunk.settings import ChunkSettings


class DecodeGraphs:
    def __init__(
        self,
        s: ChunkSettings,
        model: ChunkLM,
        attn: SinkDecodeAttention,
        sampler: ChunkedSampler,
        device: torch.device,
    ) -> None:
        self.s = s
        self.model = model
        self.attn = attn
        self.sampler = sampler
        self.buckets: List[int] = sorted(s.graph_buckets)
        gb = s.max_graph_bs
        e = s.max_penalty_entries
        self.static_ids = torch.zeros(gb, dtype=torch.int64, device=device)
        self.static_pos = torch.zeros(gb, dtype=torch.int64, device=device)
        self.static_out_loc = torch.zeros(gb, dtype=torch.int64, device=device)
        self.static_cache_slots = torch.zeros(gb, dtype=torch.int64, device=device)
        self.static_t = SamplingTensors.static(gb, s.max_top_k, device)
        self.static_pen = PenaltyEntries(
            rows=torch.zeros(e, dtype=torch.int64, device=device),
            token_ids=torch.zeros(e, dtype=torch.int64, device=device),
            counts=torch.zeros(e, dtype=torch.float32, device=device),
            bias=torch.zeros(e, dtype=torch.float32, device=device),
        )
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.out_ids: Dict[int, torch.Tensor] = {}
        self.out_host_graph = torch.zeros(gb, dtype=torch.int64, pin_memory=True)
        self.out_ready = torch.cuda.Event()
        self.pool: Optional[Any] = None

    def bucket_for(self, n: int) -> int:
        return next(bs for bs in self.buckets if bs >= n)

    def _body(self, bs: int) -> torch.Tensor:
        hidden = self.model(self.static_ids[:bs], self.static_pos[:bs], self.static_out_loc[:bs], bs)
        return self.sampler.sample_static(hidden, self.static_t.rows(bs), self.static_pen)

    def capture_all(self) -> None:
        for bs in reversed(self.buckets):
            self.capture_bucket(bs)

    def capture_bucket(self, bs: int) -> None:
        batch = dummy_decode_batch(bs, self.static_ids, self.static_pos, self.static_out_loc, self.static_cache_slots)
        self.attn.init_forward_metadata_capture_cuda_graph(bs, batch)
        self._body(bs)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            ids = self._body(bs)
        self.pool = g.pool() if self.pool is None else self.pool
        self.graphs[bs] = g
        self.out_ids[bs] = ids

    def load_penalties(self, entries: PenaltyEntries) -> None:
        """Copy this step's entries into the static ones; the rest add zero (row 0, count 0, bias 0)."""
        m = min(entries.rows.numel(), self.static_pen.rows.numel())
        self.static_pen.rows[:m].copy_(entries.rows[:m])
        self.static_pen.token_ids[:m].copy_(entries.token_ids[:m])
        self.static_pen.counts[:m].copy_(entries.counts[:m])
        self.static_pen.bias[:m].copy_(entries.bias[:m])
        self.static_pen.rows[m:].zero_()
        self.static_pen.counts[m:].zero_()
        self.static_pen.bias[m:].zero_()

    def replay(self, batch: DecodeBatch, t: SamplingTensors) -> torch.Tensor:
        n = batch.size
        bs = self.bucket_for(n)
        self.static_ids[:n].copy_(batch.input_ids, non_blocking=True)
        self.static_pos[:n].copy_(batch.positions, non_blocking=True)
        self.static_out_loc[:n].copy_(batch.out_loc, non_blocking=True)
        self.static_out_loc[n:bs].zero_()
        self.static_t.load_(t, n)
        self.attn.init_forward_metadata_replay_cuda_graph(bs, batch)
        self.graphs[bs].replay()
        out = self.out_ids[bs][:n]
        self.out_host_graph[:n].copy_(out, non_blocking=True)  # ok: FC101
        self.out_ready.record()
        return out
