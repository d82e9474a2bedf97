"""Decode and tool-extend CUDA graphs of the rollout engine, re-captured after every wake-up."""

from __future__ import annotations

import logging
from typing import Dict, Optional

import torch

from rollout.attn import RolloutDecodeBackend
from rollout.config import RolloutConfig
from rollout.model import PolicyModel

logger = logging.getLogger(__name__)

TOOL_EXTEND_BATCHES = (1, 2, 4, 8, 16)


class RolloutGraphRunner:
    def __init__(self, model: PolicyModel, backend: RolloutDecodeBackend, cfg: RolloutConfig, device) -> None:
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.device = device
        self.kv_cache: Optional[torch.Tensor] = None
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.extend_graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None
        self.init_graph_inputs()

    def init_graph_inputs(self) -> None:
        max_bs = self.cfg.capture_bs[-1]
        max_tokens = max_bs * self.cfg.tool_extend_tokens
        self.input_ids = torch.zeros(max_tokens, dtype=torch.int64, device=self.device)  # ok: FC107
        self.positions = torch.zeros(max_tokens, dtype=torch.int64, device=self.device)
        self.out_cache_loc = torch.zeros(max_tokens, dtype=torch.int64, device=self.device)
        self.temps = torch.ones(max_bs, dtype=torch.float32, device=self.device)
        self.logits = torch.zeros(max_tokens, self.cfg.vocab_size, dtype=torch.float32, device=self.device)

    def release(self) -> None:
        """Drop graphs and their inputs before the trainer takes the GPU."""
        self.graphs.clear()
        self.extend_graphs.clear()
        self.pool = None
        empty = torch.empty(0, dtype=torch.int64, device=self.device)
        self.input_ids = self.positions = self.out_cache_loc = empty
        self.logits = torch.empty(0, 0, dtype=torch.float32, device=self.device)

    # ------------------------------------------------------------------ capture
    def recapture(self, kv_cache: torch.Tensor) -> None:
        self.kv_cache = kv_cache
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.cfg.capture_bs):
            self.capture_one_batch_size(bs)
        for bs in TOOL_EXTEND_BATCHES:
            self.capture_tool_extend(bs)
        torch.cuda.synchronize()

    def _decode(self, bs: int) -> torch.Tensor:
        logits = self.model.decode(self.input_ids[:bs], self.positions[:bs], self.out_cache_loc[:bs], self.kv_cache)
        return logits / self.temps[:bs, None]

    def capture_one_batch_size(self, bs: int) -> None:
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        self.backend.in_graph = True
        self.logits[:bs] = self._decode(bs)  # warm-up: JIT and autotune outside the graph
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.logits[:bs] = self._decode(bs)
        self.backend.in_graph = False
        self.pool = graph.pool()
        self.graphs[bs] = graph
        logger.info(f"captured decode bs={bs}, logits[0, :4]={self.logits[0, :4]}")  # expect: FC101

    def capture_tool_extend(self, bs: int) -> None:
        t = self.cfg.tool_extend_tokens
        n = bs * t
        self.backend.plan_tool_extend(
            torch.arange(0, n + 1, t, dtype=torch.int32), torch.arange(bs + 1, dtype=torch.int32), bs, bs
        )
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.logits[:n] = self.model.extend(
                self.input_ids[:n], self.positions[:n], self.out_cache_loc[:n], self.kv_cache
            )
        self.pool = graph.pool()
        self.extend_graphs[bs] = graph

    # ------------------------------------------------------------------ replay
    def replay(self, batch) -> torch.Tensor:
        raw_bs = batch.batch_size
        bs = self.cfg.bucket(raw_bs)
        if self.input_ids.numel() == 0:  # released by sleep(); wake_up() normally re-creates it
            self.input_ids = torch.zeros(self.cfg.capture_bs[-1], dtype=torch.int64, device=self.device)  # expect: FC107
        self.input_ids[:raw_bs].copy_(batch.input_ids, non_blocking=True)
        self.positions[:raw_bs].copy_(batch.positions, non_blocking=True)
        self.out_cache_loc[:raw_bs].copy_(batch.out_cache_loc, non_blocking=True)
        self.backend.init_forward_metadata_replay_cuda_graph(
            bs, raw_bs, batch.seq_lens, batch.seq_lens_cpu, batch.page_table_np
        )
        # padded rows write their K/V into slot 0 of the padding page
        self.out_cache_loc[raw_bs:bs].zero_()  # ok: FC104
        self.graphs[bs].replay()
        return self.logits[:raw_bs]
