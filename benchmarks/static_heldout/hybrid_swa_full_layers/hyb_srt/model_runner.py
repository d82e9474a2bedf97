"""Owns the pools, the attention backend, the model and the graph runner."""

from __future__ import annotations

import torch

from hyb_srt.attn_backend import HybridAttnBackend
from hyb_srt.cuda_graph_runner import CudaGraphRunner
from hyb_srt.model import HybridLM
from swahybrid.config import HybridConfig
from swahybrid.metadata import ForwardBatch
from swahybrid.pools import TwoPools


class ModelRunner:
    def __init__(self, cfg: HybridConfig, device: str = "cuda") -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.pools = TwoPools(cfg, self.device)
        self.attn_backend = HybridAttnBackend(cfg, self.pools, self.device)
        self.model = HybridLM(cfg, self.attn_backend, self.pools).to(self.device, torch.bfloat16)
        self.graph_runner = CudaGraphRunner(self)

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        if fb.is_decode and fb.batch_size <= self.cfg.max_graph_bs:
            return self.graph_runner.replay(fb)
        self.attn_backend.init_forward_metadata(fb)
        if fb.is_decode:
            return self.model.forward_decode(fb)
        return self.model.forward_extend(fb)
