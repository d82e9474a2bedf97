from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import torch

from tracing import nvtx_range
from tr_attn.backend import TracedAttnBackend
from tr_attn.config import TraceEngineConfig
from tr_run.model import TracedLM


@dataclass
class DecodeBatch:
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_cpu: torch.Tensor
    max_seq_len: int


class TracedGraphRunner:
    def __init__(self, cfg: TraceEngineConfig, backend: TracedAttnBackend, model: TracedLM, device: torch.device):
        self.cfg = cfg
        self.backend = backend
        self.model = model
        max_bs = cfg.largest_bucket
        self.static_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool: Optional[tuple] = None

    def capture_all(self) -> None:
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.cfg.buckets):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            self.outputs[bs] = self.model.forward_decode(self.static_ids[:bs], self.static_positions[:bs])
        self.pool = g.pool()
        self.graphs[bs] = g

    def replay(self, batch: DecodeBatch) -> torch.Tensor:
        real_bs = batch.batch_size
        bs = next(b for b in self.cfg.buckets if b >= real_bs)
        self.static_ids[:real_bs].copy_(batch.input_ids, non_blocking=True)
        self.static_positions[:real_bs].copy_(batch.positions, non_blocking=True)
        with nvtx_range(f"replay bs={bs} max_pos={self.static_positions[:real_bs].max()}"):  # expect: FC101
            self.backend.init_forward_metadata_replay_cuda_graph(
                bs, real_bs, batch.kv_indptr_cpu, batch.kv_indices, batch.last_page_cpu
            )
            self.graphs[bs].replay()
        return self.outputs[bs][:real_bs]
