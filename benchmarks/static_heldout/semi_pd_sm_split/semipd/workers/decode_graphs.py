"""Decode graphs captured on the decode partition's stream (a green-context stream when available)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Dict

import torch

from semipd.workers.decode_worker import DecodeBatch

if TYPE_CHECKING:
    from semipd.workers.decode_worker import DecodeWorker

logger = logging.getLogger(__name__)

# buffers a replay reads by address; re-checked after every capture
_BOUND_BUFS = ("_paged_kv_indptr_buf", "_paged_kv_indices_buf", "_paged_kv_last_page_len_buf")


class DecodeGraphs:
    def __init__(self, worker: "DecodeWorker", stream: torch.cuda.Stream):
        self.worker = worker
        self.stream = stream
        self.cfg = worker.cfg
        max_bs = max(self.cfg.decode_buckets)
        self.slot_mapping = torch.zeros(max_bs, dtype=torch.int64, device=worker.device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.addr_table: Dict[int, tuple] = {}
        self.pool = None

    def capture_all(self) -> None:
        self.graphs.clear()
        for bs in sorted(self.cfg.decode_buckets, reverse=True):
            self.capture_bucket(bs)
        logger.info("captured %d decode graphs on the %s stream", len(self.graphs), "green" if self.pool else "decode")

    def capture_bucket(self, bs: int) -> None:
        fb = self.worker.dummy_batch(bs, self.slot_mapping[:bs])
        self.worker.plan_decode(fb)
        w = self.worker.graph_wrappers[bs]
        self.addr_table[bs] = tuple(getattr(w, name).data_ptr() for name in _BOUND_BUFS)  # expect: FC103
        with torch.cuda.stream(self.stream):
            self.worker.forward_decode(fb, self.slot_mapping[:bs])
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool, stream=self.stream):
            self.outputs[bs] = self.worker.forward_decode(fb, self.slot_mapping[:bs])
        if self.pool is None:
            self.pool = g.pool()
        self.graphs[bs] = g

    def replay(self, fb: DecodeBatch) -> torch.Tensor:
        bs = fb.bucket
        self.slot_mapping.resize_(bs)  # expect: FC107
        self.slot_mapping[: fb.bs].copy_(fb.slot_mapping)
        self.slot_mapping[fb.bs :].zero_()
        self.worker.plan_decode(fb)
        self.graphs[bs].replay()
        return self.outputs[bs][: fb.bs]

    def run_step(self) -> torch.Tensor:
        fb = self.worker.build_step()
        if fb.bucket is None:
            self.worker.plan_decode(fb)
            return self.worker.forward_decode(fb, fb.slot_mapping)
        return self.replay(fb)
