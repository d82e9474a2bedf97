"""One decode graph per bucket; the backend is whatever the registry built."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch

from ubr import StepBatch
from ubr_backends.registry import AttnBackend
from ubr_model.model import DecoderModel


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    valid: torch.Tensor
    logits: torch.Tensor


class CudaGraphRunner:
    def __init__(
        self,
        model: DecoderModel,
        backend: AttnBackend,
        kv_caches: List[torch.Tensor],
        buckets: Sequence[int],
        device: torch.device,
    ):
        assert list(buckets) == sorted(buckets), "capture buckets must be ascending"  # expect: FC109
        self.model = model
        self.backend = backend
        self.kv_caches = kv_caches
        self.capture_buckets = list(buckets)
        self.device = device
        self.entries: Dict[int, GraphEntry] = {}
        self.pool: Optional[tuple] = None

    @property
    def max_bs(self) -> int:
        return self.capture_buckets[-1]

    def capture(self) -> None:
        self.backend.init_cuda_graph_state(self.capture_buckets)
        for bs in reversed(self.capture_buckets):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        input_ids = torch.zeros(bs, dtype=torch.int64, device=self.device)
        positions = torch.zeros(bs, dtype=torch.int64, device=self.device)
        seq_lens = torch.ones(bs, dtype=torch.int32, device=self.device)
        valid = torch.ones(bs, dtype=torch.bool, device=self.device)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, torch.ones(bs, dtype=torch.int32))
        for _ in range(2):
            self.model.forward_decode(input_ids, positions, self.kv_caches, valid)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self.model.forward_decode(input_ids, positions, self.kv_caches, valid)
        self.pool = graph.pool()
        self.entries[bs] = GraphEntry(graph, input_ids, positions, seq_lens, valid, logits)

    def _bucket_for(self, raw_bs: int) -> int:
        return next(b for b in self.capture_buckets if b >= raw_bs)

    def replay(self, batch: StepBatch) -> torch.Tensor:
        raw_bs = batch.batch_size
        max_bucket = max(self.capture_buckets)  # ok: FC101
        if raw_bs > max_bucket:
            raise ValueError(f"batch of {raw_bs} exceeds the largest captured bucket {max_bucket}")
        bs = self._bucket_for(raw_bs)
        entry = self.entries[bs]
        entry.input_ids[:raw_bs].copy_(batch.input_ids)
        entry.positions = torch.cat([batch.positions, entry.positions[raw_bs:]])  # expect: FC107
        entry.seq_lens[:raw_bs].copy_(batch.seq_lens)
        entry.seq_lens[raw_bs:].fill_(1)
        seq_lens_cpu = torch.ones(bs, dtype=torch.int32)
        seq_lens_cpu[:raw_bs] = batch.seq_lens_cpu
        self.backend.init_forward_metadata_replay_cuda_graph(
            bs, raw_bs, entry.seq_lens, seq_lens_cpu, batch.kv_indices
        )
        entry.valid[:raw_bs].fill_(True)
        entry.valid[raw_bs:].fill_(False)  # ok: FC104
        entry.graph.replay()
        return entry.logits[:raw_bs]
