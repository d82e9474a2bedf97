from typing import Dict

import torch

from t5_attn.backend import EncDecBackend
from t5serve import T5Config

from .model import DecodeStatics, T5Model


class DecoderGraphs:
    def __init__(self, model: T5Model, backend: EncDecBackend, cfg: T5Config, device):
        self.model = model
        self.backend = backend
        self.cfg = cfg
        rows = max(cfg.buckets)
        self.st = DecodeStatics(
            input_ids=torch.zeros(rows, dtype=torch.int64, device=device),
            out_loc=torch.zeros(rows, dtype=torch.int64, device=device),
            recent_slots=torch.zeros(rows, cfg.max_distance, dtype=torch.int64, device=device),
            bias_rows=torch.zeros(rows, cfg.num_heads, cfg.max_distance, dtype=torch.float32, device=device),
        )
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: Dict[int, torch.Tensor] = {}
        self.mempool = None

    def capture_bucket(self, bs: int) -> None:
        self.backend.prepare_capture(bs)
        self.model.decode(self.st, bs)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.mempool):
            self.logits[bs] = self.model.decode(self.st, bs)
        self.mempool = g.pool()
        self.graphs[bs] = g

    def capture_all(self) -> None:
        for bs in sorted(self.cfg.buckets, reverse=True):
            self.capture_bucket(bs)

    def replay(self, bs: int, bs_real: int) -> torch.Tensor:
        self.graphs[bs].replay()
        return self.logits[bs][:bs_real]
