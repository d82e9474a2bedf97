"""One decode graph per bucket (decode rows plus a fixed prompt-chunk slot), recorded into one memory pool."""

from __future__ import annotations

from typing import Dict

import numpy as np
import torch

from prio.limits import PoolLimits
from prio_srv.attn_backend import ReservationAttnBackend
from prio_srv.batch import DecodeBatch
from prio_srv.model import PrioLM


class BucketGraphs:
    def __init__(self, lim: PoolLimits, backend: ReservationAttnBackend, model: PrioLM, device: torch.device):
        self.lim = lim
        self.backend = backend
        self.model = model
        self.buckets = sorted(lim.graph_buckets)
        mb = lim.max_bucket + lim.chunk_tokens
        self.input_ids = torch.zeros(mb, dtype=torch.int64, device=device)
        self.slots = torch.zeros(lim.max_bucket, dtype=torch.int64, device=device)
        self.page_counts = torch.ones(lim.max_bucket, dtype=torch.int32, device=device)
        self.out_loc = torch.zeros(mb, dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: Dict[int, torch.Tensor] = {}
        self.pool = None

    def _static_batch(self, bs: int) -> DecodeBatch:
        chunk = self.lim.chunk_tokens
        return DecodeBatch(
            num_rows=bs,
            num_decode_rows=bs - 1,
            chunk_rows=chunk,
            slots=self.slots[:bs],
            input_ids=self.input_ids[: bs - 1 + chunk],
            page_counts=self.page_counts[:bs],
            last_page_len_np=np.ones(bs, dtype=np.int32),
            kv_indptr_np=np.arange(bs + 1, dtype=np.int32),
            kv_indices=self.backend.graph_kv_indices,
            chunk_qo_indptr_np=np.array([0, chunk], dtype=np.int32),
            out_loc=self.out_loc[: bs - 1 + chunk],
        )

    def record(self) -> None:
        for bs in reversed(self.buckets):
            self.backend.bind_bucket(bs)
            self._fixed_batch_size = bs  # ok: FC103
            static = self._static_batch(bs)
            self.backend.stage_bucket(bs, static)
            self.backend.plan_chunk(static)
            n_tok = bs - 1 + self.lim.chunk_tokens
            for _ in range(2):
                self.model.decode_graph(self.input_ids[:n_tok], static)
            torch.cuda.synchronize()  # ok: FC101
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self.logits[bs] = self.model.decode_graph(self.input_ids[:n_tok], static)
            self.pool = graph.pool()
            self.graphs[bs] = graph

    def run_bucket(self, bs: int, batch: DecodeBatch) -> torch.Tensor:
        n = batch.input_ids.shape[0]
        self.input_ids[:n].copy_(batch.input_ids)
        self.out_loc[:n].copy_(batch.out_loc)
        self.slots[: batch.num_rows].copy_(batch.slots)
        self.page_counts[: batch.num_rows].copy_(batch.page_counts)
        self.backend.stage_bucket(bs, batch)
        if batch.chunk_rows:
            self.backend.plan_chunk(batch)
        self.graphs[bs].replay()
        return self.logits[bs][:n]
