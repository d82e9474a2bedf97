"""Decode graphs per batch bucket; the indexer runs eagerly before each replay."""

from __future__ import annotations

import bisect
from typing import Dict, Optional

import numpy as np
import torch

from dsa.batch import DecodeBatch
from dsa.config import DSAConfig
from dsa.sparse_pages import SparseIndexBuilder, SparseLayout

from .backend import DSAAttnBackend
from .model import DSAModel


class SparseGraphRunner:
    def __init__(
        self,
        cfg: DSAConfig,
        model: DSAModel,
        backend: DSAAttnBackend,
        builder: SparseIndexBuilder,
        device: torch.device,
    ):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.builder = builder
        self.batch_sizes = sorted(cfg.graph_batch_sizes)
        self.max_bs = self.batch_sizes[-1]
        self.backend.init_cuda_graph_state(self.batch_sizes)
        n = self.max_bs
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.req_pool_indices = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.out_cache_loc = torch.zeros(n, dtype=torch.long, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.mempool = None

    def bucket_for(self, bs: int) -> Optional[int]:
        i = bisect.bisect_left(self.batch_sizes, bs)
        return self.batch_sizes[i] if i < len(self.batch_sizes) else None

    def _static_batch(self, bs: int) -> DecodeBatch:
        return DecodeBatch(
            reqs=[],
            req_pool_indices=self.req_pool_indices[:bs],
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
            seq_lens=self.seq_lens[:bs],
            seq_lens_cpu=torch.ones(bs, dtype=torch.int32),
            sparse_lens=self.seq_lens[:bs],
            graph_bs=bs,
        )

    def capture(self) -> None:
        for bs in reversed(self.batch_sizes):
            self.capture_one_batch_size(bs)
        self._check_graph_mode()

    def capture_one_batch_size(self, bs: int) -> None:
        fb = self._static_batch(bs)
        lens = self.seq_lens[:bs].tolist()  # expect: FC101
        layout = self.builder.layout(np.asarray(lens, dtype=np.int32))
        self.backend.init_forward_metadata_capture_cuda_graph(bs, fb, layout)
        torch.cuda.synchronize()  # ok: FC101
        for _ in range(2):
            self.model.forward_decode(fb)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.mempool):
            out = self.model.forward_decode(fb)
        if self.mempool is None:
            self.mempool = g.pool()
        self.graphs[bs] = g
        self.outputs[bs] = out

    def _check_graph_mode(self) -> None:
        for bs, w in self.backend.graph_mla.items():
            if not w._use_cuda_graph:  # expect: FC103
                raise RuntimeError(f"bucket {bs}: MLA wrapper was built outside graph mode")

    def replay(self, fb: DecodeBatch, layout: SparseLayout) -> torch.Tensor:
        real = layout.bs
        bs = self.bucket_for(real)
        self.input_ids[:real].copy_(fb.input_ids, non_blocking=True)
        self.req_pool_indices[:real].copy_(fb.req_pool_indices, non_blocking=True)
        self.positions[:real].copy_(fb.positions, non_blocking=True)
        self.out_cache_loc[:real].copy_(fb.out_cache_loc, non_blocking=True)
        self.seq_lens[:real].copy_(fb.seq_lens, non_blocking=True)
        if bs > real:
            self.out_cache_loc[real:bs].zero_()
            self.seq_lens[real:bs].fill_(1)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, fb, layout)
        self.graphs[bs].replay()
        return self.outputs[bs][:real]
