"""One CUDA graph per action-chunk size: `chunk` decode steps, sampling and detokenization."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict

import numpy as np
import torch

from vlapolicy.config import PolicyConfig
from vlapolicy.policy.attention import PolicyAttention
from vlapolicy.policy.model import VLAPolicy

logger = logging.getLogger(__name__)


@dataclass
class ChunkGraph:
    graph: torch.cuda.CUDAGraph
    chunk: int
    gumbel: torch.Tensor
    tokens: torch.Tensor
    actions: torch.Tensor


class ChunkGraphs:
    def __init__(self, cfg: PolicyConfig, policy: VLAPolicy, attn: PolicyAttention, device: torch.device):
        self.cfg = cfg
        self.policy = policy
        self.attn = attn
        self.device = device
        R, H = cfg.num_robots, cfg.max_chunk
        self.static_first_tokens = torch.zeros(R, dtype=torch.int64, device=self.device)
        self.static_temperature = torch.ones(R, dtype=torch.float32, device=self.device)
        self.action_scale = torch.ones(cfg.action_dim, dtype=torch.float32, device=self.device)
        u = torch.rand(cfg.gumbel_pool, R, H, cfg.action_vocab, device=self.device).clamp_(1e-6, 1 - 1e-6)
        self.gumbel_pool = -torch.log(-torch.log(u))
        self.graphs: Dict[int, ChunkGraph] = {}
        self.mempool = None
        self.tick = 0
        self._token_hist = None

    def capture_all(self) -> None:
        self.attn.init_chunk_buffers(self.cfg.chunk_sizes)
        for chunk in sorted(self.cfg.chunk_sizes, reverse=True):
            self.capture_chunk(chunk)
        logger.info("captured action-chunk graphs for %s", sorted(self.graphs))

    def _dummy_rows(self, chunk: int):
        R = self.cfg.num_robots
        rows = np.tile(np.arange(R + 1, dtype=np.int32), (chunk, 1))
        last = np.tile(np.arange(1, chunk + 1, dtype=np.int32)[:, None], (1, R))
        return rows, last

    def capture_chunk(self, chunk: int) -> None:
        # actions are clipped to the calibrated joint range inside the graph
        lim = self.action_scale.abs().max().item()  # expect: FC101
        rows, last = self._dummy_rows(chunk)
        kv_indices = torch.arange(self.cfg.num_robots, dtype=torch.int32, device=self.device)
        positions = torch.zeros(self.cfg.num_robots, dtype=torch.int64, device=self.device)
        self.attn.plan_chunk(chunk, rows, last, kv_indices, positions)
        gumbel = self.gumbel_pool[0, :, :chunk].clone()
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            tokens = self.policy.decode_actions(chunk, self.static_first_tokens, gumbel, self.static_temperature)
            actions = self.policy.detokenize(tokens).clamp(-lim, lim) * self.action_scale
        if self.mempool is None:
            self.mempool = graph.pool()
        self.graphs[chunk] = ChunkGraph(graph, chunk, gumbel, tokens, actions)

    def replay(self, chunk: int, tick) -> torch.Tensor:
        graph = self.graphs[chunk]
        self.static_first_tokens.copy_(tick.first_tokens, non_blocking=True)
        setattr(self, "static_temperature", torch.full((self.cfg.num_robots,), tick.temperature, device=self.device))  # expect: FC107
        graph.gumbel = self.gumbel_pool[self.tick % self.cfg.gumbel_pool, :, :chunk].clone()  # expect: FC107
        self.attn.plan_chunk(chunk, tick.kv_indptr_rows, tick.last_rows, tick.kv_indices, tick.positions)
        graph.graph.replay()
        if getattr(self, "_token_hist", None) is None:
            self._token_hist = torch.zeros(  # ok: FC107
                self.cfg.gumbel_pool, self.cfg.num_robots, self.cfg.max_chunk, dtype=torch.int64, device=self.device
            )
        self._token_hist[self.tick % self.cfg.gumbel_pool, :, :chunk].copy_(graph.tokens)
        self.tick += 1
        return graph.actions
