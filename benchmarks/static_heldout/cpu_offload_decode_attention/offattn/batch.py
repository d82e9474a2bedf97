"""Per-step decode batch: GPU window and sink page lists, host-page lengths."""

from __future__ import annotations

import dataclasses
from typing import List

import numpy as np
import torch

from offattn.config import OffloadConfig
from offattn.gpu_pool import GPUPagePool
from offattn.host_pages import HostPageStore


@dataclasses.dataclass
class OffloadBatch:
    num_rows: int
    rids: List[int]
    rows_np: np.ndarray
    input_ids: torch.Tensor
    out_loc: torch.Tensor
    window_indptr_np: np.ndarray
    window_indices: torch.Tensor
    window_last_np: np.ndarray
    window_lens_dev: torch.Tensor
    sink_indptr_np: np.ndarray
    sink_indices: torch.Tensor
    host_lens_np: np.ndarray
    max_host_len_dev: torch.Tensor

    @classmethod
    def build(cls, rids: List[int], seq_lens: List[int], last_tokens: List[int], cfg: OffloadConfig,
              pool: GPUPagePool, store: HostPageStore, device: torch.device) -> "OffloadBatch":
        ps, s = cfg.page_size, cfg.sink_pages
        win_pages = [pool.pages[r][s:] for r in rids]
        win_lens = np.array([len(p) for p in win_pages], dtype=np.int32)
        w_indptr = np.zeros(len(rids) + 1, dtype=np.int32)
        np.cumsum(win_lens, out=w_indptr[1:])
        last = np.array([(n - 1) % ps + 1 for n in seq_lens], dtype=np.int32)
        host_lens = np.array([store.host_len(r) * ps for r in rids], dtype=np.int32)
        loc = np.array([pool.pages[r][-1] * ps + (n - 1) % ps for r, n in zip(rids, seq_lens)], dtype=np.int64)
        sink_idx = np.concatenate([np.asarray(pool.pages[r][:s], dtype=np.int32) for r in rids])
        return cls(
            num_rows=len(rids),
            rids=list(rids),
            rows_np=np.arange(len(rids)),
            input_ids=torch.tensor(last_tokens, dtype=torch.int64, device=device),
            out_loc=torch.from_numpy(loc).to(device, non_blocking=True),
            window_indptr_np=w_indptr,
            window_indices=torch.from_numpy(np.concatenate(win_pages).astype(np.int32)).to(device, non_blocking=True),
            window_last_np=last,
            window_lens_dev=torch.from_numpy(win_lens).to(device, non_blocking=True),
            sink_indptr_np=np.arange(0, (len(rids) + 1) * s, s, dtype=np.int32),
            sink_indices=torch.from_numpy(sink_idx).to(device, non_blocking=True),
            host_lens_np=host_lens,
            max_host_len_dev=torch.tensor(int(host_lens.max(initial=0)), dtype=torch.int32, device=device),
        )
