"""Pinned staging between the GPU and the CPU attention: q goes down, (o, lse) of the host pages come back up."""

from __future__ import annotations

import torch

from offattn.config import OffloadConfig


class PinnedStaging:
    def __init__(self, cfg: OffloadConfig, device: torch.device):
        n, nq, hd = cfg.max_batch, cfg.num_qo_heads, cfg.head_dim
        self.q_host = torch.empty((n, nq, hd), dtype=torch.bfloat16, pin_memory=True)
        self.o_host = torch.empty((n, nq, hd), dtype=torch.float32, pin_memory=True)
        self.lse_host = torch.empty((n, nq), dtype=torch.float32, pin_memory=True)
        self.o_dev = torch.zeros((n, nq, hd), dtype=torch.float32, device=device)
        self.lse_dev = torch.full((n, nq), -float("inf"), dtype=torch.float32, device=device)
        self.q_ready = torch.cuda.Event()
        self.h2d_stream = torch.cuda.Stream(device=device)
