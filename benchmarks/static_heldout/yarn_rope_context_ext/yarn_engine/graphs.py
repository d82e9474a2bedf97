"""Decode graphs per (band, bucket)."""
from __future__ import annotations

import bisect
import logging
from typing import Dict, Tuple

import torch

from yarnserve.attn.decode import BandDecodeAttention
from yarnserve.bands import BandTable, RopeBand, Scaling
from yarnserve.settings import ServeSettings
from yarn_engine.batch import DecodeBatch
from yarn_engine.model import YarnLM

logger = logging.getLogger(__name__)


class BandGraphRunner:
    def __init__(self, model: YarnLM, attn: BandDecodeAttention, table: BandTable, settings: ServeSettings, device) -> None:
        self.model = model
        self.attn = attn
        self.table = table
        self.settings = settings
        self.buckets = sorted(settings.graph_buckets)
        max_bs = self.buckets[-1]
        self.static_input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_seq_lens = torch.ones(max_bs, dtype=torch.int64, device=device)
        self.static_out_loc = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.graphs: Dict[Tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[Tuple[int, int], torch.Tensor] = {}
        self.captured = False
        self.mem_pool = None

    def can_replay(self, band_idx: int, n: int) -> bool:
        return self.captured and n <= self.buckets[-1] and band_idx < len(self.table)

    def capture_all(self) -> None:
        self.attn.init_graph_buffers()
        self.mem_pool = torch.cuda.graph_pool_handle()
        for band in self.table.bands:
            for bs in reversed(self.buckets):
                self.capture_band(band, bs)
        self.captured = True

    def capture_band(self, band: RopeBand, bs: int) -> None:
        batch = DecodeBatch.dummy(
            band.index,
            bs,
            self.static_input_ids[:bs],
            self.static_positions[:bs],
            self.static_seq_lens[:bs],
            self.static_out_loc[:bs],
            split_far=band.scaling is Scaling.YARN,
        )
        self.attn.prepare_band(band, bs, batch)
        self.model.decode(self.static_input_ids[:bs], self.static_positions[:bs], band.index, batch)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mem_pool):
            out = self.model.decode(self.static_input_ids[:bs], self.static_positions[:bs], band.index, batch)
        self.graphs[(band.index, bs)] = graph
        self.outputs[(band.index, bs)] = out
        logger.info(f"captured band {band.name} bs={bs} max_pos={self.static_positions[:bs].max()}")  # expect: FC101
        self.attn.graph_key = None

    def replay_band(self, band: RopeBand, batch: DecodeBatch) -> torch.Tensor:
        assert self.captured, "capture_all() must run before the first replay"  # ok: FC109
        n = batch.size
        bs = self.buckets[bisect.bisect_left(self.buckets, n)]
        self.static_input_ids[:n].copy_(batch.input_ids)
        self.static_positions[:n].copy_(batch.positions)
        self.static_seq_lens[:n].copy_(batch.seq_lens)
        self.static_out_loc[:n].copy_(batch.out_loc)
        self.attn.prepare_band(band, bs, batch)
        self.graphs[(band.index, bs)].replay()
        return self.outputs[(band.index, bs)][:n]
