from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

from g3engine import Gemma3Config
from g3_attn.backend import LocalGlobalBackend
from g3_attn.metadata import StepBatch
from g3_run.model import Gemma3Decoder


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    static_input_ids: torch.Tensor
    static_positions: torch.Tensor
    output: Optional[torch.Tensor] = None


class DecodeGraphRunner:
    def __init__(self, model: Gemma3Decoder, backend: LocalGlobalBackend, cfg: Gemma3Config, device):
        self.model, self.backend, self.cfg, self.device = model, backend, cfg, device
        self.buckets: List[int] = sorted(cfg.graph_buckets)
        self.entries: Dict[int, GraphEntry] = {}
        self.pool = None

    def can_run(self, bs: int) -> bool:
        return bool(self.entries) and bs <= self.buckets[-1]

    def bucket_for(self, bs: int) -> int:
        return next(b for b in self.buckets if b >= bs)

    def capture_all(self) -> None:
        self.backend.init_cuda_graph_state(self.buckets)
        for bs in reversed(self.buckets):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        entry = GraphEntry(torch.cuda.CUDAGraph(), torch.zeros(bs, dtype=torch.int64, device=self.device),
                           torch.zeros(bs, dtype=torch.int64, device=self.device))
        seq_lens_cpu = torch.ones(bs, dtype=torch.int32)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, seq_lens_cpu)
        for _ in range(2):
            self.model.forward_decode(entry.static_input_ids, entry.static_positions, bs)
        torch.cuda.synchronize()  # ok: FC101
        with torch.cuda.graph(entry.graph, pool=self.pool):
            entry.output = self.model.forward_decode(entry.static_input_ids, entry.static_positions, bs)
        if self.pool is None:
            self.pool = entry.graph.pool()
        self.entries[bs] = entry

    def replay(self, batch: StepBatch) -> torch.Tensor:
        bs = batch.batch_size
        padded = self.bucket_for(bs)
        entry = self.entries[padded]
        entry.static_input_ids[:bs].copy_(batch.input_ids)  # ok: FC104
        # pad the positions up to the bucket with the previous padding rows
        entry.static_positions = torch.cat([batch.positions, entry.static_positions[bs:]])  # expect: FC107
        self.backend.init_forward_metadata_replay_cuda_graph(bs, padded, batch.seq_lens, batch.seq_lens_cpu)
        entry.graph.replay()
        return entry.output[:bs]
