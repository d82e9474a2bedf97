from typing import Dict

import torch

from td_engine.backend import TelemetryAttnBackend
from td_engine.batch import StepBatch
from td_engine.config import EngineConfig
from td_engine.model import TDModel


class GraphRunner:
    def __init__(self, cfg: EngineConfig, model: TDModel, backend: TelemetryAttnBackend, kv_cache: torch.Tensor):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.kv_cache = kv_cache
        device = backend.device
        mb = max(cfg.buckets)
        self.static_tokens = torch.zeros(mb, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(mb, dtype=torch.int64, device=device)
        self.static_seq_lens = torch.zeros(mb, dtype=torch.int32, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool = None
        self.padded_rows = 0

    def bucket_for(self, n: int) -> int:
        for b in self.cfg.buckets:
            if b >= n:
                return b
        raise ValueError(f"{n} rows exceed the largest bucket")

    def capture_all(self) -> None:
        for bs in sorted(self.cfg.buckets, reverse=True):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        tokens, positions = self.static_tokens[:bs], self.static_positions[:bs]
        self.model.forward_decode(tokens, positions, self.kv_cache, bs)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            self.outputs[bs] = self.model.forward_decode(tokens, positions, self.kv_cache, bs)
        if self.pool is None:
            self.pool = g.pool()
        self.graphs[bs] = g

    def replay(self, batch: StepBatch) -> torch.Tensor:
        real = batch.batch_size
        bs = self.bucket_for(real)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, batch)
        self.static_tokens[:real].copy_(batch.tokens)
        self.static_positions[:real].copy_(batch.positions)
        self.static_seq_lens[:real].copy_(batch.seq_lens)
        self.static_seq_lens[real:bs].zero_()
        self.padded_rows += (self.static_seq_lens[:bs] == 0).sum().item()  # expect: FC101
        self.graphs[bs].replay()
        return self.outputs[bs][:real]
