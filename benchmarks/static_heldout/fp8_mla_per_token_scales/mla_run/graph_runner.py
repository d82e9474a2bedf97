"""Decode graphs per batch-size bucket over the FP8 latent cache."""
from __future__ import annotations

from typing import Dict, List, Tuple

import torch

from mla_fp8 import MLAConfig
from mla_attn.backend import FP8MLABackend
from mla_attn.meta import MLADecodeMeta
from mla_run.model import MLAModel


class MLAGraphRunner:
    def __init__(self, model: MLAModel, backend: FP8MLABackend, cfg: MLAConfig, device: torch.device) -> None:
        self.model, self.backend, self.cfg = model, backend, cfg
        max_bs = cfg.max_graph_bs * (1 + cfg.num_spec_tokens)
        self.static_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_slots = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.graphs: Dict[Tuple[int, int], Tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.index_capacity: Dict[int, int] = {}
        self.mempool = None

    def record(self, bs: int, q_len: int) -> None:
        self.backend.capture_decode(bs, q_len)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            logits = self.model.forward_decode(self.static_ids[: bs * q_len], self.static_slots[: bs * q_len])
        self.mempool = graph.pool()
        self.graphs[(bs, q_len)] = (graph, logits)
        if bs in self.backend.graph_mla:
            self.index_capacity[bs] = self.backend.graph_mla[bs]._kv_indices_buf.numel()  # expect: FC103

    def replay(self, meta: MLADecodeMeta, input_ids: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        bs = self.cfg.bucket_for(meta.num_seqs)
        self.backend.prepare_decode(meta, bs)
        if meta.q_len > 1:
            self.backend.plan_verify(meta)
        t = input_ids.shape[0]
        self.static_ids[:t].copy_(input_ids, non_blocking=True)
        self.static_slots[:t].copy_(slots, non_blocking=True)
        graph, logits = self.graphs[(bs, meta.q_len)]
        graph.replay()
        return logits[:t]

    def replay_check(self, bs: int) -> List[int]:
        """Debugging aid: the slots the last replay of a bucket wrote."""
        return self.static_slots[:bs].tolist()  # ok: FC101
