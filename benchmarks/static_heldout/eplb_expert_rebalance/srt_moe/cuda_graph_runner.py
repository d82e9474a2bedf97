"""SGLang-style decode graph runner; the expert load recorder is advanced after every replay."""

from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING, Dict, Optional

import numpy as np
import torch

from srt_moe.forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from srt_moe.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner") -> None:
        self.model_runner = model_runner
        cfg = model_runner.cfg
        dev = model_runner.device
        self.capture_bs = sorted(cfg.cuda_graph_bs)
        self.max_bs = self.capture_bs[-1]
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32, device=dev)
        self.out_cache_loc = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.block_table = torch.zeros(self.max_bs, cfg.max_pages_per_seq, dtype=torch.int32, device=dev)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.output_buffers: Dict[int, torch.Tensor] = {}
        self.graph_pool: Optional[tuple] = None
        model_runner.attn_backend.init_cuda_graph_state(self.capture_bs)
        self.capture()

    def can_run(self, fb: ForwardBatch) -> bool:
        return fb.forward_mode.is_decode() and fb.batch_size <= self.max_bs and not fb.use_trtllm

    def _dummy_batch(self, bs: int) -> ForwardBatch:
        lens = np.ones(bs, dtype=np.int32)
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            seq_lens=self.seq_lens[:bs],
            seq_lens_cpu=torch.from_numpy(lens),
            out_cache_loc=self.out_cache_loc[:bs],
            req_pages=[np.zeros(1, dtype=np.int32) for _ in range(bs)],
            block_table=self.block_table[:bs],
            max_seq_len=1,
        )

    def capture(self) -> None:
        self.graph_pool = torch.cuda.graph_pool_handle()
        for bs in reversed(self.capture_bs):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        mr = self.model_runner
        fb = self._dummy_batch(bs)
        mr.attn_backend.init_forward_metadata_capture_cuda_graph(bs, fb)
        for _ in range(2):
            torch.cuda.synchronize()  # ok: FC101
            mr.model.forward_decode(fb.input_ids, fb)
        # warm-up routing must not count as load
        mr.eplb_recorder.step_counts.zero_()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.graph_pool):
            out = mr.model.forward_decode(fb.input_ids, fb)
        self.graphs[bs] = graph
        self.output_buffers[bs] = out

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        raw_bs = fb.batch_size
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
        self.input_ids[:raw_bs].copy_(fb.input_ids, non_blocking=True)
        self.positions[:raw_bs].copy_(fb.positions, non_blocking=True)
        self.seq_lens[:raw_bs].copy_(fb.seq_lens, non_blocking=True)
        self.out_cache_loc[:raw_bs].copy_(fb.out_cache_loc, non_blocking=True)
        if bs != raw_bs:
            self.seq_lens[raw_bs:bs].fill_(1)
            self.out_cache_loc[raw_bs:bs].zero_()
        self.model_runner.attn_backend.init_forward_metadata_replay_cuda_graph(
            raw_bs, bs, fb.seq_lens_cpu, fb.req_pages
        )
        self.graphs[bs].replay()
        recorder = self.model_runner.eplb_recorder
        recorder.on_step(raw_bs)
        logger.debug("expert load this window: %s", recorder.window_counts)  # ok: FC101
        return self.output_buffers[bs][:, :raw_bs]
