"""Recompute the KV of requests that just crossed original_max, with the long factors."""

from __future__ import annotations

from typing import List

import numpy as np
import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper

from longrope.config import EngineConfig


class RegimeSwitchRecompute:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        ws_bytes = cfg.max_recompute_tokens * cfg.num_qo_heads * (cfg.head_dim + 1) * 4 * 2
        self.workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD", backend="fa2")
        self.qo_indptr_cpu = torch.zeros(cfg.max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_cpu = torch.zeros(cfg.max_bs, dtype=torch.int32, pin_memory=True)

    def plan_recompute(self, seq_lens_np: np.ndarray, pages_gpu: torch.Tensor, page_ids: torch.Tensor) -> int:
        n = len(seq_lens_np)
        ps = self.cfg.page_size
        qo_np = self.qo_indptr_cpu.numpy()
        qo_np[0] = 0
        np.cumsum(seq_lens_np, out=qo_np[1 : n + 1])
        self.last_cpu[:n] = torch.from_numpy((seq_lens_np - 1) % ps + 1)
        kv_indptr = torch.zeros(n + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(pages_gpu, 0, out=kv_indptr[1:])
        self.prefill_wrapper.plan(self.qo_indptr_cpu[: n + 1], kv_indptr, page_ids, self.last_cpu[:n],  # expect: FC102
                                  self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, ps, causal=True)
        return int(qo_np[n])

    def recompute(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill_wrapper.run(q, kv_cache)
