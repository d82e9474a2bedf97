"""Decode graphs per batch bucket. Every rank records the same buckets (the all-to-alls are inside)."""

from __future__ import annotations

from typing import Dict

import numpy as np
import torch

from ulysses.config import UlyssesConfig
from ulysses_rt.attention import UlyssesAttention
from ulysses_rt.kv import SPBatch
from ulysses_rt.model import UlyssesModel


class UlyssesGraphs:
    def __init__(self, model: UlyssesModel, attn: UlyssesAttention, cfg: UlyssesConfig, world: int, device: torch.device):
        self.model = model
        self.attn = attn
        self.cfg = cfg
        self.world = world
        self.device = device
        max_local = -(-cfg.max_graph_bs // world)
        self.static_ids = torch.zeros(max_local, dtype=torch.int64, device=device)
        self.static_pos = torch.zeros(max_local, dtype=torch.int64, device=device)
        self.static_out_loc = torch.zeros(cfg.max_graph_bs, dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.mempool = torch.cuda.graph_pool_handle()

    def bucket(self, n: int) -> int:
        for bs in self.cfg.graph_batch_sizes:
            if bs >= n:
                return bs
        return -1

    def _dummy_batch(self, bs: int) -> SPBatch:
        ones = torch.ones(bs, dtype=torch.int32)
        return SPBatch(
            request_ids=[f"__dummy{i}" for i in range(bs)],
            is_prefill=False,
            seq_lens_cpu=ones,
            local_lens_cpu=ones,
            local_lens_gpu=ones.to(self.device),
            page_counts_cpu=np.ones(bs, dtype=np.int32),
            last_page_len_cpu=ones,
            page_ids_gpu=torch.zeros(bs, dtype=torch.int32, device=self.device),
            kv_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32),
            input_ids_gpu=self.static_ids,
            positions_gpu=self.static_pos,
            out_loc_gpu=self.static_out_loc[:bs],
        )

    def _run(self, bs: int) -> torch.Tensor:
        local = bs // self.world
        return self.model.forward_decode(self.static_ids[:local], self.static_pos[:local], self.static_out_loc[:bs])

    def record(self, bs: int) -> None:
        self.attn.make_graph_wrapper(bs)
        self.attn.prepare_decode(bs, self._dummy_batch(bs))
        for _ in range(2):
            self._run(bs)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.mempool):
            out = self._run(bs)
        self.graphs[bs] = g
        self.outputs[bs] = out

    def record_all(self) -> None:
        for bs in sorted(self.cfg.graph_batch_sizes, reverse=True):
            self.record(bs)
        self.attn.check_graph_buffers()

    def run_bucket(self, bs: int, batch: SPBatch) -> torch.Tensor:
        n = batch.input_ids_gpu.shape[0]
        self.static_ids[:n].copy_(batch.input_ids_gpu)
        self.static_pos[:n].copy_(batch.positions_gpu)
        self.static_out_loc[: batch.out_loc_gpu.shape[0]].copy_(batch.out_loc_gpu)
        self.attn.prepare_decode(bs, batch)
        self.graphs[bs].replay()
        return self.outputs[bs][:n]
