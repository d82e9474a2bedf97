from __future__ import annotations

import numpy as np
import torch

from yoco.attention.cross_backend import CrossAttnBackend
from yoco.attention.window_backend import WindowAttnBackend
from yoco.config import ServerArgs, YocoConfig
from yoco.forward_batch import ForwardBatch
from yoco.mem.pools import GlobalKVPool, WindowKVPool


class YocoAttnBackend:
    """Fans metadata preparation out to the self-decoder and cross-decoder backends."""

    def __init__(self, cfg: YocoConfig, server_args: ServerArgs, window_pool: WindowKVPool,
                 global_pool: GlobalKVPool, device: torch.device):
        self.window = WindowAttnBackend(cfg, server_args, window_pool, device)
        self.cross = CrossAttnBackend(cfg, server_args, global_pool, device)

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        for backend in (self.window, self.cross):
            backend.init_forward_metadata(fb)

    def init_forward_metadata_capture_cuda_graph(self, bs: int, req_slots: torch.Tensor, req_slots_np: np.ndarray,
                                                 seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor) -> None:
        for backend in (self.window, self.cross):
            backend.init_forward_metadata_capture_cuda_graph(bs, req_slots, req_slots_np, seq_lens, seq_lens_cpu)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, req_slots: torch.Tensor, req_slots_np: np.ndarray,
                                                seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, raw_bs: int) -> None:
        for backend in (self.window, self.cross):
            backend.init_forward_metadata_replay_cuda_graph(bs, req_slots, req_slots_np, seq_lens, seq_lens_cpu, raw_bs)
