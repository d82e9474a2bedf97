"""Graphs for decode-only steps, one per batch bucket; mixed steps run eagerly."""

from typing import Dict

import torch

from budget.attn.mixed_backend import MixedFlashInferBackend
from budget.config import BudgetConfig
from budget.request import SchedulerOutput
from budget_rt.model import MixedLM


class DecodeOnlyGraphRunner:
    def __init__(self, cfg: BudgetConfig, model: MixedLM, backend: MixedFlashInferBackend) -> None:
        self.cfg = cfg
        self.model = model
        self.backend = backend
        max_bs = max(cfg.decode_buckets)
        self.static_ids = torch.zeros(max_bs, dtype=torch.long, device=cfg.device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.backend.init_cuda_graph_state(max_bs)

    def bucket_for(self, bs: int) -> int:
        for b in self.cfg.decode_buckets:
            if b >= bs:
                return b
        return -1

    def capture_one_batch_size(self, bs: int) -> None:
        torch.cuda.synchronize()  # ok: FC101
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = self.model.forward_decode(self.static_ids[:bs], bs)
        self.graphs[bs] = g
        self.outputs[bs] = out

    def can_run(self, out: SchedulerOutput) -> bool:
        return out.decode_only and self.bucket_for(out.num_decodes) in self.graphs

    def replay(self, out: SchedulerOutput, input_ids: torch.Tensor) -> torch.Tensor:
        real = out.num_decodes
        bs = self.bucket_for(real)
        self.static_ids[:real].copy_(input_ids)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, out)
        self.graphs[bs].replay()
        return self.outputs[bs][:real]
