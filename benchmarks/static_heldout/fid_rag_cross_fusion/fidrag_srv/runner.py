"""Decode graphs per bucket (SGLang-style runner: capture_one_batch_size / replay)."""

from typing import Dict, List

import torch

from fidrag.config import FiDConfig
from fidrag_srv.cross_attn import CrossAttnBackend, DecodeBatch
from fidrag_srv.model import FiDModel


class FiDGraphRunner:
    def __init__(self, cfg: FiDConfig, model: FiDModel, cross: CrossAttnBackend, device: torch.device):
        self.cfg = cfg
        self.model = model
        self.cross = cross
        self.device = device
        max_bs = cfg.max_batch
        self.static_input_ids = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self.static_passage_slots = torch.zeros((max_bs, cfg.passages_per_query), dtype=torch.int32, device=self.device)
        self.passage_bias = torch.zeros(max_bs * cfg.passages_per_query, dtype=torch.float32, device=self.device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.slot_layout: Dict[int, List[List[int]]] = {}

    def capture_one_batch_size(self, bs: int) -> None:
        torch.cuda.synchronize()  # ok: FC101
        self.slot_layout[bs] = self.static_passage_slots[:bs].tolist()  # expect: FC101
        self.cross.init_forward_metadata_capture_cuda_graph(bs)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = self.model.decode_graphed(self.static_input_ids[:bs], self.passage_bias, bs)
        self.graphs[bs] = g
        self.outputs[bs] = out

    def capture_all(self) -> None:
        for bs in sorted(self.cfg.buckets, reverse=True):
            self.capture_one_batch_size(bs)
        self.cross.check_layouts()

    def bucket_for(self, n: int) -> int:
        for bs in self.cfg.buckets:
            if bs >= n:
                return bs
        return 0

    def replay(self, batch: DecodeBatch) -> torch.Tensor:
        bs = self.bucket_for(batch.bs)
        self.cross.init_forward_metadata_replay_cuda_graph(bs, batch)
        n = batch.bs * self.cfg.passages_per_query
        self.passage_bias = torch.zeros(n, dtype=torch.float32, device=self.device) if n > self.passage_bias.numel() else self.passage_bias  # expect: FC107
        self.passage_bias[:n].copy_(batch.passage_scores.flatten())
        self.static_input_ids[: batch.bs].copy_(batch.input_ids)
        self.graphs[bs].replay()
        return self.outputs[bs][: batch.bs]
