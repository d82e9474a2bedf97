"""Buffers the draft and verify graphs both read.

The draft and target KV pools allocate pages in lockstep, so one page table (indptr + indices)
serves both caches; each pool stages it before its own plan, every step.
"""

import numpy as np
import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper

from dualspec.config import SpecConfig


class SharedPageBuffers:
    def __init__(self, cfg: SpecConfig, device):
        max_bs = cfg.max_batch_size
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(cfg.max_total_pages, dtype=torch.int32, device=device)
        self.draft_last_page = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.verify_last_page = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_pinned = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.verify_last_page_pinned = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.draft_last_page_np = np.ones(max_bs, dtype=np.int32)
        self.owner = None
        # shared eager wrapper: the draft's EAGLE extend over verified positions
        self.extend_workspace = torch.zeros(cfg.extend_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.extend_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.extend_workspace, cfg.kv_layout)
