"""Decode graphs per bucket; the MoE layers' load accounting is captured with them."""
from __future__ import annotations

import bisect
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from mm_attn.attn_backend import AttnBackend
from mm_model.model import MoEModel


class DecodeGraphs:
    def __init__(
        self,
        model: MoEModel,
        attn: AttnBackend,
        kv_caches: List[torch.Tensor],
        mtp_cache: torch.Tensor,
        buckets: Sequence[int],
        device: torch.device,
    ):
        self.model = model
        self.attn = attn
        self.kv_caches = kv_caches
        self.mtp_cache = mtp_cache
        self.buckets = sorted(buckets)
        self.input_ids = torch.zeros(self.buckets[-1], dtype=torch.int64, device=device)
        self.dummy_pages = torch.zeros(self.buckets[-1], dtype=torch.int32, device=device)
        self.entries: Dict[int, Tuple[torch.cuda.CUDAGraph, Tuple[torch.Tensor, torch.Tensor]]] = {}
        self.pool: Optional[tuple] = None

    @property
    def max_bs(self) -> int:
        return self.buckets[-1]

    def bucket_for(self, n: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, n)]

    def capture_all(self) -> None:
        self.attn.init_graph_buffers(self.buckets)
        for bs in reversed(self.buckets):
            self._capture_one(bs)
        torch.cuda.synchronize()  # ok: FC101

    def _capture_one(self, bs: int) -> None:
        self.attn.prepare_decode(bs, bs, np.ones(bs, dtype=np.int32), self.dummy_pages)
        ids = self.input_ids[:bs]
        self.model.decode(ids, self.kv_caches, self.mtp_cache, bs)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = self.model.decode(ids, self.kv_caches, self.mtp_cache, bs)
        self.pool = g.pool()
        self.entries[bs] = (g, out)

    def replay(self, input_ids: torch.Tensor, seq_lens_np: np.ndarray, page_ids: torch.Tensor):
        raw_bs = input_ids.shape[0]
        bs = self.bucket_for(raw_bs)
        self.input_ids[:raw_bs].copy_(input_ids)
        padded = np.ones(bs, dtype=np.int32)
        padded[:raw_bs] = seq_lens_np
        self.attn.prepare_decode(bs, raw_bs, padded, page_ids)
        # Padding rows must not read past the live rows' pages.
        self.attn.kv_indptr[raw_bs + 1 : bs + 1] = self.attn.kv_indptr[raw_bs]  # expect: FC104
        g, (logits, mtp_logits) = self.entries[bs]
        g.replay()
        return logits[:raw_bs], mtp_logits[:raw_bs]
