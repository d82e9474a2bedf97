"""One decode graph per bucket shared by every adapter: the LoRA slot ids are a graph input."""

from __future__ import annotations

import logging
from typing import Dict

import torch

from mavl import DecodeRoute, RouterConfig, ids_summary
from mv_attn.backend import LMAttentionBackend
from mv_run.lm import LoRALanguageModel

logger = logging.getLogger(__name__)


class SharedDecodeGraphPool:
    def __init__(
        self, cfg: RouterConfig, model: LoRALanguageModel, backend: LMAttentionBackend,
        kv_cache: torch.Tensor, device: torch.device,
    ):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.kv_cache = kv_cache
        self.static_input_ids = torch.zeros(cfg.max_batch, dtype=torch.int64, device=device)
        self.static_lora_ids = torch.zeros(cfg.max_batch, dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.mempool = torch.cuda.graph_pool_handle()

    def record_all(self) -> None:
        self.backend.init_graph_buffers()
        for bs in sorted(self.cfg.buckets, reverse=True):
            self.record_bucket(bs)

    def record_bucket(self, bs: int) -> None:
        self.backend.plan_capture(bs)
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()  # ok: FC101
        with torch.cuda.graph(graph, pool=self.mempool):
            out = self.model.forward_decode(self.static_input_ids[:bs], self.static_lora_ids[:bs], self.kv_cache)
        self.graphs[bs] = graph
        self.outputs[bs] = out
        logger.info("recorded bucket %d (slots %s)", bs, ids_summary(self.static_lora_ids[:bs]))

    def replay_bucket(self, route: DecodeRoute, input_ids: torch.Tensor) -> torch.Tensor:
        n = route.batch_size
        bs = self.cfg.bucket_for(n)
        self.static_input_ids[:n].copy_(input_ids)
        self.static_lora_ids[:n].copy_(route.lora_ids)  # ok: FC104
        self.backend.prepare_replay(bs, route)
        self.graphs[bs].replay()
        return self.outputs[bs][:n]
