"""CUDA-graph runner: one decode graph per batch-size bucket, captured largest first
into a shared memory pool, replayed after the backend has re-planned the bucket."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Dict

import torch

from ..batch import ForwardBatch, ForwardMode
from ..utils import GraphInputBuffers, bucket_for

if TYPE_CHECKING:  # pragma: no cover
    from .model_runner import ModelRunner

logger = logging.getLogger(__name__)


class CudaGraphRunner:
    def __init__(self, runner: "ModelRunner") -> None:
        self.runner = runner
        self.cfg = runner.cfg
        self.model = runner.model
        self.backend = runner.attn_backend
        self.device = runner.device
        self.capture_bs = sorted(set(self.cfg.cuda_graph_bs))
        self.max_bs = self.capture_bs[-1]
        self.max_seq_len = self.cfg.max_context_len
        self.bufs = GraphInputBuffers(self.max_bs, self.device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool = None
        self.backend.init_cuda_graph_state(self.max_bs)
        self.capture()

    def can_run(self, fb: ForwardBatch) -> bool:
        if fb.batch_size > self.max_bs:
            return False
        return max(fb.seq_lens) <= self.max_seq_len  # expect: FC101

    # ---------------------------------------------------------------- capture
    def capture(self) -> None:
        for bs in reversed(self.capture_bs):
            self.capture_one_batch_size(bs)
        logger.info("captured %d decode graphs (bs %s)", len(self.graphs), self.capture_bs)

    def capture_one_batch_size(self, bs: int) -> None:
        fb = self._dummy_batch(bs)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, fb)
        for _ in range(2):  # warm up allocator and autotuners outside the graph
            self.model(fb.input_ids, fb.positions, fb)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self.model(fb.input_ids, fb.positions, fb)
        if self.pool is None:
            self.pool = graph.pool()
        self.graphs[bs] = graph
        self.outputs[bs] = logits

    def _dummy_batch(self, bs: int) -> ForwardBatch:
        b = self.bufs
        self.dummy_f32 = torch.zeros(bs, dtype=torch.float32, device=self.device)  # ok: FC107
        dummy_i32 = torch.zeros(bs, dtype=torch.int32, device=self.device)
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            req_ids=(),
            input_ids=b.input_ids[:bs],
            positions=b.positions[:bs],
            seq_lens=b.seq_lens[:bs],
            page_table=torch.zeros(bs, self.cfg.max_pages_per_seq(), dtype=torch.int32, device=self.device),
            out_cache_loc=b.out_cache_loc[:bs],
            temperatures=self.dummy_f32,
            top_k=dummy_i32,
            output_lens=dummy_i32,
            min_new_tokens=dummy_i32,
            stop_token_ids=dummy_i32[:1],
        )

    # ----------------------------------------------------------------- replay
    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        assert self.graphs, "capture() must run before replay()"  # ok: FC109
        raw_bs = fb.batch_size
        bs = bucket_for(raw_bs, self.capture_bs)
        self.bufs.prepare(bs)
        self.bufs.load(fb, bs)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, fb)

        # model_runner builds this runner, so it cannot be imported at module level
        from .model_runner import record_graph_stats

        record_graph_stats(self.runner.stats, fb, bs)
        self.graphs[bs].replay()
        return self.outputs[bs][:raw_bs]
