"""One CUDA graph of the lookahead verify forward per batch-size bucket."""

from __future__ import annotations

import logging
from typing import Dict

import torch

from ljserve.attention import LookaheadAttnBackend, StepMetadata
from ljserve.config import LookaheadConfig
from ljserve.model import LookaheadLM

logger = logging.getLogger(__name__)


class LookaheadGraphRunner:
    def __init__(self, model: LookaheadLM, backend: LookaheadAttnBackend, cfg: LookaheadConfig, device: torch.device):
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.device = device
        self.T = cfg.tokens_per_request
        self.max_graph_bs = max(cfg.graph_buckets)
        self.max_graph_seq_len = cfg.max_seq_len - self.T
        self.static_input_ids = torch.zeros((self.max_graph_bs, self.T), dtype=torch.int64, device=device)
        self.static_positions = torch.zeros((self.max_graph_bs, self.T), dtype=torch.int64, device=device)
        self.static_seq_lens = torch.ones(self.max_graph_bs, dtype=torch.int32, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool = None

    def capture_all(self) -> None:
        self.backend.init_cuda_graph_state()
        for bs in sorted(self.cfg.graph_buckets, reverse=True):
            self.capture_bucket(bs)
        self.backend.check_layouts()

    def capture_bucket(self, bs: int) -> None:
        meta = self.backend.dummy_metadata(bs)
        self.backend.plan_verify(meta)
        longest = int(self.static_seq_lens[:bs].max())  # expect: FC101
        if longest > self.max_graph_seq_len:
            raise RuntimeError(f"static seq_lens for bucket {bs} exceed the captured range")
        ids, pos = self.static_input_ids[:bs], self.static_positions[:bs]
        for _ in range(2):
            self.model.forward_lookahead(ids, pos, meta)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.model.forward_lookahead(ids, pos, meta)
        if self.pool is None:
            self.pool = graph.pool()
        self.graphs[bs] = graph
        self.outputs[bs] = out
        logger.info("captured lookahead verify graph for bucket %d (%d query rows)", bs, bs * self.T)

    def replay(self, input_ids: torch.Tensor, positions: torch.Tensor, seq_lens: torch.Tensor, meta: StepMetadata):
        bs, bucket = meta.batch_size, meta.bucket
        if bucket * self.T > self.static_input_ids.numel():
            self.static_input_ids = torch.zeros((bucket, self.T), dtype=torch.int64, device=self.device)  # expect: FC107
        self.static_input_ids[:bs].copy_(input_ids)
        self.static_positions[:bs].copy_(positions)
        self.static_seq_lens[:bs].copy_(seq_lens)
        if (self.static_seq_lens[:bs] > self.max_graph_seq_len).any():  # expect: FC101
            raise RuntimeError("a request outgrew the captured verify graphs")
        if not self.backend.verify_plan_is_current(meta):
            self.backend.plan_verify(meta)
        self.graphs[bucket].replay()
        return self.outputs[bucket][: bs * self.T]
