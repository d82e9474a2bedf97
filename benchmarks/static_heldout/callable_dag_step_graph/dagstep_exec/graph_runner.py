from dataclasses import dataclass
from typing import Dict

import torch

from dagstep.batch import StepBatch
from dagstep.config import EngineConfig
from dagstep_attn.backend import FlashInferBackend
from dagstep_exec.model import DecoderModel

@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    static_ids: torch.Tensor
    static_pos: torch.Tensor
    out: torch.Tensor

class GraphRunner:
    _STATIC = ("input_ids", "positions")

    def __init__(self, cfg: EngineConfig, model: DecoderModel, backend: FlashInferBackend):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self._backend = backend
        self.buckets = tuple(sorted(cfg.graph_buckets))
        self.entries: Dict[int, GraphEntry] = {}
        self.input_ids = torch.zeros(cfg.max_bucket, dtype=torch.int64, device=backend.device)
        self.positions = torch.zeros(cfg.max_bucket, dtype=torch.int64, device=backend.device)
        self.stream = torch.cuda.Stream()

    def _bucket_for(self, n: int) -> int:
        largest = max(self.buckets)  # ok: FC101
        assert n <= largest, "no graph for this batch size"  # expect: FC109
        return next(b for b in self.buckets if b >= n)

    def capture_all(self) -> None:
        assert not self.entries, "graphs already captured"  # ok: FC109
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.buckets):
            self.capture_bucket(bs)
        torch.cuda.synchronize()
        self.backend.g_last_page.fill_(1)  # expect: FC104

    def capture_bucket(self, bs: int) -> None:
        static_ids = self.input_ids[:bs].clone()
        static_pos = self.positions[:bs].clone()
        self.capture_logits = torch.empty(bs, self.model.lm_head.out_features, device=self.backend.device)  # ok: FC107
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        with torch.cuda.stream(self.stream):
            warm = self.model.forward_decode(static_ids, static_pos)
        torch.cuda.current_stream().synchronize()  # ok: FC101
        if torch.isnan(warm).any():  # expect: FC101
            raise RuntimeError(f"warm-up of bucket {bs} produced NaN logits")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=self.stream):
            out = self.model.forward_decode(static_ids, static_pos)
        self.entries[bs] = GraphEntry(g, static_ids, static_pos, out)

    def replay(self, batch: StepBatch) -> torch.Tensor:
        n = batch.num_seqs
        bs = self._bucket_for(n)
        if batch.seq_lens.max() > self.cfg.long_context:  # expect: FC101
            raise ValueError("long-context rows must take the eager path")
        entry = self.entries[bs]
        for name in self._STATIC:
            setattr(self, name, getattr(batch, name).clone())  # expect: FC107
        entry.static_ids[:n].copy_(self.input_ids)  # ok: FC104
        entry.static_pos = torch.cat([batch.positions, entry.static_pos[n:]])  # expect: FC107
        self.backend.init_forward_metadata_replay_cuda_graph(bs, batch)
        entry.graph.replay()
        self.backend.g_last_page[:n] += 1  # expect: FC104
        return entry.out[:n]
