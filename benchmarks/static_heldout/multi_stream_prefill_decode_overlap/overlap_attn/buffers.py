"""Per-stream metadata buffers. Only the decode stream's are bound to graph wrappers."""

import torch

from overlap import OverlapConfig


class LaneBuffers:
    def __init__(self, cfg: OverlapConfig, device: torch.device):
        self.device = device
        mb = cfg.max_batch
        self.kv_indptr = {"decode": torch.zeros(mb + 1, dtype=torch.int32, device=device)}
        self.kv_indices = {
            "prefill": torch.zeros(cfg.max_pages, dtype=torch.int32, device=device),
            "decode": torch.zeros(cfg.max_pages, dtype=torch.int32, device=device),
        }
        self.last_page_len = {"decode": torch.ones(mb, dtype=torch.int32, device=device)}
        self.indptr_pinned = {"decode": torch.zeros(mb + 1, dtype=torch.int32, pin_memory=True)}
        self.last_pinned = {"decode": torch.ones(mb, dtype=torch.int32, pin_memory=True)}
        self.init_stream_buffers()

    def init_stream_buffers(self) -> None:
        self.kv_indptr["decode"].zero_()
        self.last_page_len["decode"].fill_(1)  # ok: FC104
