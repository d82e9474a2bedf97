"""Decode graphs per batch-size bucket over the compacted page table."""

from dataclasses import dataclass
from typing import Dict, List, Tuple

import torch

from snapkv.attn_backend import SnapDecodeBackend
from snapkv.config import SnapConfig
from snapkv.model import SnapDecoder


@dataclass
class BucketGraph:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor
    window_mass: torch.Tensor
    seq_lens: torch.Tensor
    max_len_at_capture: int


class DecodeGraphRunner:
    def __init__(self, cfg: SnapConfig, model: SnapDecoder, backend: SnapDecodeBackend, device: torch.device):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.device = device
        self.buckets: List[int] = sorted(cfg.graph_buckets)
        self.max_bs = self.buckets[-1]
        graph_workspace = torch.zeros(cfg.graph_workspace_mib << 20, dtype=torch.uint8, device=device)  # ok: FC106
        self.backend.init_cuda_graph_state(self.max_bs, graph_workspace)
        self.static_input_ids = torch.zeros(self.max_bs, dtype=torch.long, device=device)
        self.static_positions = torch.zeros(self.max_bs, dtype=torch.long, device=device)
        self.static_seq_lens = torch.ones(self.max_bs, dtype=torch.int32, device=device)
        self.graphs: Dict[int, BucketGraph] = {}
        self.pool = None

    def bucket_for(self, bs: int) -> int:
        for b in self.buckets:
            if b >= bs:
                return b
        raise ValueError(f"batch of {bs} rows exceeds the largest graph bucket {self.max_bs}")

    def record_all(self) -> None:
        for bs in reversed(self.buckets):
            self.record_bucket(bs)

    def record_bucket(self, bs: int) -> None:
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        for _ in range(2):
            self.model.decode(self.static_input_ids[:bs], self.static_positions[:bs], bs, in_graph=True)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            logits, mass = self.model.decode(self.static_input_ids[:bs], self.static_positions[:bs], bs, in_graph=True)
        if self.pool is None:
            self.pool = g.pool()
        max_len = self.static_seq_lens[:bs].max().item()  # expect: FC101
        self.graphs[bs] = BucketGraph(g, logits, mass, self.static_seq_lens[:bs], max_len)

    def replay(self, bs: int, input_ids: torch.Tensor, positions: torch.Tensor, seq_lens: torch.Tensor,
               rows_cpu: torch.Tensor, rows_gpu: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        padded = self.bucket_for(bs)
        entry = self.graphs.get(padded)
        self.static_input_ids[:bs].copy_(input_ids)
        self.static_positions[:bs].copy_(positions)
        entry.seq_lens = seq_lens.clone()  # expect: FC107
        self.backend.init_forward_metadata_replay_cuda_graph(bs, padded, rows_cpu, rows_gpu)
        entry.graph.replay()
        return entry.logits[:bs], entry.window_mass[:bs]
