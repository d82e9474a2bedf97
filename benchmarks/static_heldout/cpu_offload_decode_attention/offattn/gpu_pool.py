"""GPU pages: the sink pages and the recent window of every running request (NHD pages)."""

from __future__ import annotations

from typing import Dict, List

import numpy as np
import torch

from offattn.config import OffloadConfig


class GPUPagePool:
    def __init__(self, cfg: OffloadConfig, device: torch.device):
        self.cfg = cfg
        shape = (cfg.gpu_pages, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]
        self.v = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]
        self.page_table_np = np.zeros((cfg.max_batch, cfg.gpu_pages_per_req), dtype=np.int32)
        self.page_table_dev = torch.zeros(cfg.max_batch, cfg.gpu_pages_per_req, dtype=torch.int32, device=device)
        self.pages: Dict[int, List[int]] = {}
        self.free: List[int] = list(range(cfg.gpu_pages))

    def window_len(self, rid: int) -> int:
        return len(self.pages[rid]) - self.cfg.sink_pages

    def release_window_prefix(self, rid: int, row: int, k: int) -> None:
        s = self.cfg.sink_pages
        dropped = self.pages[rid][s : s + k]
        self.pages[rid] = self.pages[rid][:s] + self.pages[rid][s + k :]
        self.free.extend(dropped)
        m = len(self.pages[rid])
        self.page_table_np[row, :m] = self.pages[rid]
        self.page_table_dev[row, :m] = torch.from_numpy(self.page_table_np[row, :m]).to(self.page_table_dev.device)

    def write(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        page, slot = loc // self.cfg.page_size, loc % self.cfg.page_size
        self.k[layer_id][page, slot] = k
        self.v[layer_id][page, slot] = v
