"""Graphs for the GPU part of every layer, one set per bucket, recorded into one pool."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np
import torch

from offattn.batch import OffloadBatch
from offattn.config import OffloadConfig
from offload_rt.gpu_attention import RecentWindowAttention
from offload_rt.model import OffloadLM


class OffloadDecodeGraph:
    def __init__(self, cfg: OffloadConfig, model: OffloadLM, attn: RecentWindowAttention, device: torch.device):
        self.cfg = cfg
        self.model = model
        self.attn = attn
        self.buckets = sorted(cfg.graph_buckets)
        mb = cfg.max_bucket
        self.h_static = torch.zeros(mb, cfg.hidden_size, dtype=torch.bfloat16, device=device)
        self.out_loc = torch.zeros(mb, dtype=torch.int64, device=device)
        self.window_lens = torch.ones(mb, dtype=torch.int32, device=device)
        self.sink_indices = torch.zeros(mb * cfg.sink_pages, dtype=torch.int32, device=device)
        self.graphs: Dict[Tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outs: Dict[Tuple[int, int], Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.pool = None

    def bucket_for(self, n: int) -> Optional[int]:
        return next((b for b in self.buckets if b >= n), None)

    def _static_batch(self, bs: int) -> OffloadBatch:
        s = self.cfg.sink_pages
        return OffloadBatch(
            num_rows=bs,
            rids=list(range(bs)),
            rows_np=np.arange(bs),
            input_ids=torch.zeros(bs, dtype=torch.int64, device=self.h_static.device),
            out_loc=self.out_loc[:bs],
            window_indptr_np=np.arange(bs + 1, dtype=np.int32),
            window_indices=self.attn.graph_kv_indices[:bs],
            window_last_np=np.ones(bs, dtype=np.int32),
            window_lens_dev=self.window_lens[:bs],
            sink_indptr_np=np.arange(0, (bs + 1) * s, s, dtype=np.int32),
            sink_indices=self.sink_indices[: bs * s],
            host_lens_np=np.zeros(bs, dtype=np.int32),
            max_host_len_dev=self.window_lens[0],
        )

    def capture_gpu_part(self) -> None:
        for bs in reversed(self.buckets):
            self.attn.bind_bucket(bs)
            self.attn.active_bs = bs
            static = self._static_batch(bs)
            self.attn.prepare_gpu_replay(bs, static)
            for layer in self.model.layers:
                layer.gpu_part(self.h_static[:bs], static)
                torch.cuda.synchronize()  # ok: FC101
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool):
                    self.outs[(bs, layer.layer_id)] = layer.gpu_part(self.h_static[:bs], static)
                self.pool = graph.pool()
                self.graphs[(bs, layer.layer_id)] = graph

    def replay_gpu_part(self, bs: int, layer_id: int, h: torch.Tensor, batch: OffloadBatch):
        n = batch.num_rows
        self.h_static[:n].copy_(h)
        if layer_id == 0:
            self.out_loc[:n].copy_(batch.out_loc)
        self.graphs[(bs, layer_id)].replay()
        o, lse, q = self.outs[(bs, layer_id)]
        return o[:n], lse[:n], q[:n]
