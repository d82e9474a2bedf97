"""The engine loop: host histories -> penalty entries, graph replay or eager chunked sampling."""

from __future__ import annotations

import collections
from typing import Deque, Dict, List, Optional, Sequence

import numpy as np
import torch

import flashcheck
from vcserve.attention import SinkDecodeAttention
from vcserve.graphs import DecodeGraphs
from vcserve.kv import Request, SinkPagePool, build_decode_batch
from vcserve.model import ChunkLM
from vcserve.sampler import ChunkedSampler
from vocabchunk.head import ChunkedLMHead
from vocabchunk.history import TokenHistory, bias_entries, expand_rows
from vocabchunk.params import PenaltyEntries, SamplingTensors
from vocabchunk.settings import ChunkSettings


class ChunkEngine:
    def __init__(self, s: ChunkSettings, device: str = "cuda") -> None:
        dev = torch.device(device)
        self.s = s
        self.device = dev
        self.pool = SinkPagePool(s, dev)
        self.attn = SinkDecodeAttention(s, self.pool, dev)
        self.model = ChunkLM(s, self.attn, self.pool).to(dev, torch.bfloat16)
        self.head = ChunkedLMHead(self.model.embed.weight, s.vocab_chunk, s.max_top_k)
        scratch = self.attn.decode_eager._float_workspace_buffer  # expect: FC103
        self.sampler = ChunkedSampler(self.head, s, dev, scratch)
        self.graphs = DecodeGraphs(s, self.model, self.attn, self.sampler, dev)
        self.history = TokenHistory()
        self.running: Dict[int, Request] = {}
        self.waiting: Deque[Request] = collections.deque()
        self.last_ids = torch.zeros(s.max_batch, dtype=torch.int64, device=dev)
        self.stage_pinned = torch.empty((4, s.max_penalty_entries), dtype=torch.float64, pin_memory=True)

    def _stage_entries(self, rows_np, ids_np, counts_np, bias_np) -> PenaltyEntries:
        """History and bias entries built on the host, one pinned staging copy to the device."""
        packed = np.stack([rows_np, ids_np, counts_np, bias_np]).astype(np.float64)
        total = packed.shape[1]
        if total > self.stage_pinned.shape[1]:
            self.stage_pinned = torch.empty((4, 2 * total), dtype=torch.float64, pin_memory=True)  # ok: FC107
        host = self.stage_pinned[:, :total]
        host.numpy()[:] = packed
        dev = host.to(self.device, non_blocking=True)
        return PenaltyEntries(rows=dev[0].long(), token_ids=dev[1].long(), counts=dev[2].float(), bias=dev[3].float())

    def _graph_penalties(self, reqs: Sequence[Request]) -> PenaltyEntries:
        ids_np, counts_np, per_row_np = self.history.flatten([r.rid for r in reqs])
        b_ids, b_vals, b_per_row = bias_entries([r.params for r in reqs])
        rows_np = np.concatenate([np.repeat(np.arange(len(reqs)), per_row_np), np.repeat(np.arange(len(reqs)), b_per_row)])
        return self._stage_entries(
            rows_np,
            np.concatenate([ids_np, b_ids]),
            np.concatenate([counts_np, np.zeros_like(b_vals)]),
            np.concatenate([np.zeros_like(counts_np), b_vals]),
        )

    def _eager_penalties(self, reqs: Sequence[Request], t: SamplingTensors) -> Optional[PenaltyEntries]:
        parts: List[PenaltyEntries] = []
        if (t.presence_penalty != 0).any() or (t.frequency_penalty != 0).any():  # expect: FC101
            ids_np, counts_np, per_row_np = self.history.flatten([r.rid for r in reqs])
            per_row = torch.from_numpy(per_row_np).to(self.device, non_blocking=True)
            counts = torch.from_numpy(counts_np).to(self.device, non_blocking=True)
            parts.append(
                PenaltyEntries(
                    rows=expand_rows(per_row),
                    token_ids=torch.from_numpy(ids_np).to(self.device, non_blocking=True),
                    counts=counts,
                    bias=torch.zeros_like(counts),
                )
            )
        b_ids, b_vals, b_per_row = bias_entries([r.params for r in reqs])
        if b_ids.size:
            total = int(b_per_row.sum())  # ok: FC101
            vals = torch.from_numpy(b_vals).to(self.device, non_blocking=True)
            parts.append(
                PenaltyEntries(
                    rows=expand_rows(torch.from_numpy(b_per_row).to(self.device, non_blocking=True), total),
                    token_ids=torch.from_numpy(b_ids).to(self.device, non_blocking=True),
                    counts=torch.zeros_like(vals),
                    bias=vals,
                )
            )
        return PenaltyEntries.concat(parts) if parts else None

    @flashcheck.hot_path
    def step(self) -> Optional[torch.Tensor]:
        reqs = list(self.running.values())[: self.s.max_batch]
        if not reqs:
            return None
        for r in reqs:
            self.pool.grow(r.rid)
        batch = build_decode_batch(reqs, self.pool, self.last_ids, self.device)
        t = SamplingTensors.from_params([r.params for r in reqs], self.s.max_top_k, self.device)
        if batch.size <= self.s.max_graph_bs:
            self.graphs.load_penalties(self._graph_penalties(reqs))
            next_ids = self.graphs.replay(batch, t)
            # one more token per row for the next step, without another host round trip
            self.attn.graph_last_page_len[: batch.size].add_(1)  # expect: FC104
        else:
            self.attn.init_forward_metadata(batch)
            hidden = self.model(batch.input_ids, batch.positions, batch.out_loc, batch.size)
            next_ids = self.sampler.sample_eager(hidden, t, self._eager_penalties(reqs, t))
        self.last_ids.index_copy_(0, batch.cache_slots, next_ids)
        return next_ids
