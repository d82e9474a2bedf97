"""Decode graphs: model, bias, graph processors and greedy argmax recorded per bucket."""
from __future__ import annotations

from typing import Dict, List, Optional

import torch

from lpserve.attn.decode import DecodeAttention
from lpserve.batch import StepBatch
from lpserve.config import ServeConfig
from lpserve.processors.base import GraphLogitsProcessor
from lpserve_rt.model import DecoderModel


class DecodeGraphBank:
    def __init__(
        self,
        cfg: ServeConfig,
        model: DecoderModel,
        attn: DecodeAttention,
        graph_procs: List[GraphLogitsProcessor],
        device: torch.device,
    ):
        self.cfg = cfg
        self.model = model
        self.attn = attn
        self.graph_procs: List[GraphLogitsProcessor] = graph_procs
        rows = cfg.max_batch_size
        self.static_ids = torch.zeros(rows, dtype=torch.long, device=device)
        self.static_pos = torch.zeros(rows, dtype=torch.long, device=device)
        self.bias = torch.zeros(rows, cfg.vocab_size, dtype=torch.float32, device=device)
        self.static_next = torch.zeros(rows, dtype=torch.long, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.mempool = None

    def bucket_for(self, bs: int) -> Optional[int]:
        for b in self.cfg.graph_buckets:
            if b >= bs:
                return b
        return None

    def record_all(self) -> None:
        self.attn.init_graph_buffers()
        for bs in sorted(self.cfg.graph_buckets, reverse=True):
            self.record_bucket(bs)

    def record_bucket(self, bs: int) -> None:
        self.attn.init_capture_metadata(bs)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            self._decode_body(bs)
        self.mempool = graph.pool()
        self.graphs[bs] = graph

    def _decode_body(self, bs: int) -> None:
        logits = self.model.decode(self.static_ids[:bs], self.static_pos[:bs], bs).float()
        logits = logits + self.bias[:bs]
        for proc in self.graph_procs:
            logits = proc.apply_graph(logits, bs)
        self.static_next[:bs].copy_(torch.argmax(logits, dim=-1))

    def replay(self, batch: StepBatch) -> torch.Tensor:
        bs = batch.num_rows
        padded = self.bucket_for(bs)
        self.static_ids[:bs].copy_(batch.last_tokens[:bs])
        self.static_pos[:bs].copy_(batch.positions)
        if padded is None:
            self.attn.plan_eager(batch)
            self._decode_body(bs)
            return self.static_next[:bs]
        self.static_ids[bs:padded].zero_()
        self.static_pos[bs:padded].zero_()
        self.attn.replay_prepare(batch, padded)
        self.graphs[padded].replay()
        return self.static_next[:bs]
