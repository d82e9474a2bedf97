"""Decode graphs, one per batch-size bucket."""
from __future__ import annotations

import logging
from typing import Dict, Tuple

import torch

from pcache import PrefixCacheConfig
from pc_attn.backend import PrefixCacheBackend
from pc_attn.metadata import PrefixStepMeta
from pc_run.model import PrefixDecoder

logger = logging.getLogger(__name__)


class DecodeGraphRunner:
    def __init__(self, model: PrefixDecoder, backend: PrefixCacheBackend, cfg: PrefixCacheConfig, device):
        self.model, self.backend, self.cfg = model, backend, cfg
        max_bs = cfg.max_graph_bs
        self.static_input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_slots = torch.arange(max_bs, dtype=torch.int64, device=device)
        self.static_seq_lens = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.graphs: Dict[int, Tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.mempool = None

    def capture_one_batch_size(self, bs: int) -> None:
        self.backend.init_forward_metadata_capture_cuda_graph(bs, self.static_seq_lens)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            logits = self.model.forward_decode(self.static_input_ids[:bs], self.static_positions[:bs], self.static_slots[:bs])
        self.mempool = graph.pool()
        self.graphs[bs] = (graph, logits)
        logger.info(f"captured decode bs={bs}, longest={self.static_seq_lens[:bs].max()}")  # expect: FC101

    def replay(self, meta: PrefixStepMeta, input_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor):
        n = meta.num_decodes
        bs = self.cfg.bucket_for(n)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, meta)
        self.static_input_ids[:n].copy_(input_ids, non_blocking=True)  # ok: FC104
        self.static_slots[:n].copy_(slots, non_blocking=True)
        if n < bs:
            pad = torch.zeros(bs - n, dtype=positions.dtype, device=positions.device)
            self.static_positions = torch.cat([positions, pad])  # expect: FC107
        else:
            self.static_positions[:n].copy_(positions, non_blocking=True)
        self.graphs[bs][0].replay()
        return self.graphs[bs][1][:n]
