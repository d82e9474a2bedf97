"""Decode graphs per bucket; the replay rebuilds metadata for the formed batch, plans, replays."""

from dataclasses import dataclass
from typing import Dict

import torch

from kb_attn.backend import BatcherBackend
from kb_attn.meta import FlashInferBuilder
from kb_run.model import BatchedLM
from kvbatch.batcher import FormedBatch
from kvbatch.config import BatcherConfig


@dataclass
class CapturedBucket:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor


class DecodeGraphs:
    def __init__(
        self,
        model: BatchedLM,
        backend: BatcherBackend,
        builder: FlashInferBuilder,
        kv_cache: torch.Tensor,
        cfg: BatcherConfig,
        pool=None,
    ):
        self.model = model
        self.backend = backend
        self.builder = builder
        self.kv_cache = kv_cache
        self.cfg = cfg
        self.pool = pool
        dev = cfg.device
        max_bs = cfg.decode_buckets[-1]
        self.static_input_ids = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.static_positions = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.static_slots = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.slot_tokens = torch.zeros(cfg.max_slots, dtype=torch.int64, device=dev)
        self.graphs: Dict[int, CapturedBucket] = {}

    def _forward(self, bs: int) -> torch.Tensor:
        logits = self.model.forward_decode(
            self.static_input_ids[:bs], self.static_positions[:bs], self.kv_cache, self.static_slots[:bs]
        )
        rows = self.builder.row_map[:bs].clamp_min(0).long()
        self.slot_tokens.index_copy_(0, rows, torch.argmax(logits, dim=-1))
        return logits

    def capture_bucket(self, bs: int) -> None:
        self.backend.plan_bucket(self.builder.dummy(bs))
        self._forward(bs)  # warm-up
        torch.cuda.current_stream().synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            logits = self._forward(bs)
        self.graphs[bs] = CapturedBucket(graph=g, logits=logits)

    def capture_all(self) -> None:
        for bs in sorted(self.cfg.decode_buckets, reverse=True):
            self.capture_bucket(bs)

    def replay(
        self, batch: FormedBatch, input_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor
    ) -> torch.Tensor:
        meta = self.builder.build(batch)
        self.backend.plan_bucket(meta)
        # padding rows: empty KV ranges
        meta.kv_indptr[meta.num_rows + 1 :] = meta.kv_indptr[meta.num_rows]  # expect: FC104
        n = meta.num_rows
        self.static_input_ids[:n].copy_(input_ids, non_blocking=True)  # ok: FC104
        self.static_positions[:n].copy_(positions, non_blocking=True)
        self.static_slots[:n].copy_(slots, non_blocking=True)
        entry = self.graphs[meta.padded]
        entry.graph.replay()
        return entry.logits[: meta.num_real]  # expect: FC101
