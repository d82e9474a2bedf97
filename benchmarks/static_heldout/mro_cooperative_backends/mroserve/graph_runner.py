"""Decode CUDA graphs, one per batch-size bucket, captured through the backend."""

from __future__ import annotations

import logging
from typing import Dict, Optional

import torch

from mroserve.batch import ForwardBatch, ForwardMode
from mroserve.config import EngineConfig
from mroserve_attn.base import AttentionBackend

logger = logging.getLogger(__name__)


class CudaGraphRunner:
    """Captures ``model`` in decode mode for each bucket and replays it per step.

    The backend prepares its graph-bound buffers in
    ``init_forward_metadata_capture_cuda_graph`` / ``..._replay_cuda_graph``;
    this runner owns the static model inputs and the output buffers.
    """

    def __init__(self, model: torch.nn.Module, backend: AttentionBackend, cfg: EngineConfig, device: torch.device) -> None:
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.device = device
        self.batch_sizes = [bs for bs in cfg.graph_batch_sizes if bs <= cfg.max_batch_size]
        self.max_bs = self.batch_sizes[-1]
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.output_logits: Dict[int, torch.Tensor] = {}
        self.pool: Optional[tuple] = None

        max_bs = self.max_bs
        self.static_input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_out_cache_loc = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_seq_lens = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.static_kv_indptr = torch.arange(max_bs + 1, dtype=torch.int32, device=device)
        self.static_kv_indices = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.static_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.static_prefix_lens = torch.full((max_bs,), cfg.shared_prefix_tokens, dtype=torch.int32, device=device)
        self.static_block_tables = torch.zeros(max_bs, 1, dtype=torch.int32, device=device)
        backend.init_cuda_graph_state(max_bs)

    def can_run(self, fb: ForwardBatch) -> bool:
        return fb.forward_mode.is_decode() and fb.batch_size <= self.max_bs

    def _bucket(self, n: int) -> int:
        for bs in self.batch_sizes:
            if bs >= n:
                return bs
        raise ValueError(f"batch of {n} is larger than the largest graph bucket {self.max_bs}")

    def _capture_batch(self, bs: int) -> ForwardBatch:
        """A decode batch of ``bs`` one-token requests, each owning page 0 (the pool's scratch page)."""
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=self.static_input_ids[:bs],
            positions=self.static_positions[:bs],
            out_cache_loc=self.static_out_cache_loc[:bs],
            seq_lens=self.static_seq_lens[:bs],
            seq_lens_cpu=torch.ones(bs, dtype=torch.int32),
            kv_indptr=self.static_kv_indptr[: bs + 1],
            kv_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32),
            kv_indices=self.static_kv_indices[:bs],
            kv_last_page_len=self.static_last_page_len[:bs],
            kv_last_page_len_cpu=torch.ones(bs, dtype=torch.int32),
            prefix_lens=self.static_prefix_lens[:bs],
            block_tables=self.static_block_tables[:bs],
        )

    def capture(self) -> None:
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.batch_sizes):
            self.capture_one_batch_size(bs)
        torch.cuda.synchronize()
        logger.info("captured %d decode graphs (%s)", len(self.graphs), self.batch_sizes)

    def capture_one_batch_size(self, bs: int) -> None:
        fb = self._capture_batch(bs)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, fb)
        for wrapper in self.backend.graph_wrappers(bs):
            if not getattr(wrapper, "_use_cuda_graph", False):  # expect: FC103
                raise RuntimeError(f"bucket {bs}: decode wrapper was not built in CUDA graph mode")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.model(fb.input_ids, fb.positions, fb)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self.model(fb.input_ids, fb.positions, fb)
        if self.pool is None:
            self.pool = graph.pool()
        self.graphs[bs] = graph
        self.output_logits[bs] = logits

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        n = fb.batch_size
        bs = self._bucket(n)
        self.static_input_ids[:n].copy_(fb.input_ids)  # ok: FC104
        self.static_positions[:n].copy_(fb.positions)
        self.static_out_cache_loc[:n].copy_(fb.out_cache_loc)
        self.static_out_cache_loc[n:bs].zero_()
        self.static_seq_lens[:n].copy_(fb.seq_lens)
        self.static_seq_lens[n:bs].fill_(1)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, fb)
        self.graphs[bs].replay()
        return self.output_logits[bs][:n]
