from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, List

import numpy as np
import torch

from ecache import ServerConfig
from ec_attn.backend import CachedPromptBackend
from ec_server.model import PromptCacheModel

logger = logging.getLogger(__name__)


@dataclass
class DecodeBatch:
    """Device inputs padded to the bucket by the server, host lengths and page lists."""

    input_ids: torch.Tensor
    out_loc: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_np: np.ndarray
    page_lists: List[List[int]]

    @property
    def batch_size(self) -> int:
        return len(self.page_lists)


class DecodeGraphs:
    _STATIC_INPUTS = ("static_input_ids", "static_out_loc")

    def __init__(self, model: PromptCacheModel, backend: CachedPromptBackend, cfg: ServerConfig, device):
        self.model, self.backend, self.device = model, backend, device
        self.buckets = sorted(cfg.graph_buckets)
        max_bs = self.buckets[-1]
        self.static_input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_out_loc = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_seq_lens = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool = torch.cuda.graph_pool_handle()

    def capture_all(self) -> None:
        self.backend.init_decode_buffers(self.buckets)
        for bs in reversed(self.buckets):
            self.capture_bucket(bs)
        logger.info("decode graphs captured with layout %s", self.backend._kv_layout)  # ok: FC103

    def capture_bucket(self, bs: int) -> None:
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        args = (self.static_input_ids[:bs], self.static_out_loc[:bs], bs)
        self.model.forward_decode(*args)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            self.outputs[bs] = self.model.forward_decode(*args)
            logger.debug(f"recording bucket {bs}: seq lens {self.static_seq_lens[:bs]}")  # expect: FC101
        self.graphs[bs] = g

    def describe(self) -> Dict[int, object]:
        return {bs: vars(w).get("_fixed_batch_size") for bs, w in self.backend.graph_wrappers.items()}  # expect: FC103

    def bucket_for(self, bs: int) -> int:
        return next(b for b in self.buckets if b >= bs)

    def replay(self, batch: DecodeBatch) -> torch.Tensor:
        bs = batch.batch_size
        padded = self.bucket_for(bs)
        for name in self._STATIC_INPUTS:
            setattr(self, name, getattr(batch, name[len("static_"):]).clone())  # expect: FC107
        self.static_seq_lens[:padded].copy_(batch.seq_lens[:padded])  # ok: FC104
        self.backend.prepare_decode(bs, padded, self.static_seq_lens, batch.seq_lens_np, batch.page_lists)
        self.graphs[padded].replay()
        return self.outputs[padded][:bs]
