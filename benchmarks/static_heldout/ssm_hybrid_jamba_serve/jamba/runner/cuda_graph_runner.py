"""Decode CUDA graphs per batch-size bucket.

Every bucket's graph reads the attention layers' page tables *and* the Mamba
layers' state indices by address, so capture binds both and replay refreshes
both in place.
"""
from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING, Dict, List

import torch

from jamba.runner.forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from jamba.runner.model_runner import JambaModelRunner

logger = logging.getLogger(__name__)


class JambaCudaGraphRunner:
    def __init__(self, model_runner: "JambaModelRunner"):
        self.model_runner = model_runner
        self.device = model_runner.device
        self.capture_bs: List[int] = sorted(model_runner.cfg.cuda_graph_bs)
        self.max_bs = self.capture_bs[-1]
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.captured_max_len: Dict[int, int] = {}
        self.graph_pool = None
        with torch.device(self.device):
            self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64)
            self.positions = torch.zeros(self.max_bs, dtype=torch.int64)
            self.req_pool_indices = torch.zeros(self.max_bs, dtype=torch.int32)
            self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32)
            self.out_cache_loc = torch.zeros(self.max_bs, dtype=torch.int64)
        self.seq_lens_cpu = torch.ones(self.max_bs, dtype=torch.int32)
        self.capture()

    def _bucket_for(self, raw_bs: int) -> int:
        return self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]

    def can_run(self, fb: ForwardBatch) -> bool:
        return fb.forward_mode.is_decode() and fb.batch_size <= self.max_bs

    def capture(self) -> None:
        for bs in reversed(self.capture_bs):
            graph, out = self.capture_one_batch_size(bs)
            self.graphs[bs] = graph
            self.outputs[bs] = out
            self.captured_max_len[bs] = self.model_runner.cfg.max_context_len

    def capture_one_batch_size(self, bs: int):
        runner = self.model_runner
        runner.attn_backend.init_forward_metadata_capture_cuda_graph(
            bs, self.req_pool_indices[:bs], self.seq_lens[:bs]
        )
        fb = ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            rids=[],
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            seq_lens_cpu=self.seq_lens_cpu[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
        )

        def run_once():
            return runner.model.forward_decode(fb.input_ids, fb.positions, fb)

        for _ in range(2):
            torch.cuda.synchronize()  # ok: FC101
            run_once()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.graph_pool):
            out = run_once()
        self.graph_pool = graph.pool()
        return graph, out

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        raw_bs = fb.batch_size
        bs = self._bucket_for(raw_bs)
        longest = int(fb.seq_lens.max())  # expect: FC101
        if longest > self.captured_max_len[bs]:
            raise ValueError(f"sequence of {longest} tokens exceeds the captured bucket {bs}")
        self.input_ids[:raw_bs].copy_(fb.input_ids)
        self.positions[:raw_bs].copy_(fb.positions)
        self.req_pool_indices[:raw_bs].copy_(fb.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(fb.seq_lens)
        self.out_cache_loc[:raw_bs].copy_(fb.out_cache_loc)
        self.seq_lens_cpu[:raw_bs].copy_(fb.seq_lens_cpu)
        if bs != raw_bs:
            self.req_pool_indices[raw_bs:bs].fill_(-1)
            self.seq_lens[raw_bs:bs].fill_(1)
            self.out_cache_loc[raw_bs:bs].zero_()
        logger.debug("replay bs=%d raw_bs=%d seq_lens=%s", bs, raw_bs, fb.seq_lens)  # ok: FC101
        self.model_runner.attn_backend.init_forward_metadata_replay_cuda_graph(
            bs, raw_bs, fb, self.req_pool_indices[:bs]
        )
        self.graphs[bs].replay()
        return self.outputs[bs][:raw_bs]
