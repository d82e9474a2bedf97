from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING, Dict

import numpy as np
import torch

from yoco.forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from yoco.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner"):
        self.model_runner = model_runner
        self.device = model_runner.device
        self.capture_bs = model_runner.server_args.graph_batch_sizes
        self.max_bs = max(self.capture_bs)
        dev = self.device
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.out_cache_loc = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.global_cache_loc = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.req_slots = torch.zeros(self.max_bs, dtype=torch.int32, device=dev)
        self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32, device=dev)
        self.seq_lens_cpu = torch.ones(self.max_bs, dtype=torch.int32)
        self.req_slots_np = np.full(self.max_bs, -1, dtype=np.int32)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool = None

    def can_run(self, fb: ForwardBatch) -> bool:
        return fb.forward_mode.is_decode() and fb.batch_size <= self.max_bs

    def capture(self) -> None:
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.capture_bs):
            self.capture_one_batch_size(bs)
        torch.cuda.synchronize()

    def _static_batch(self, bs: int) -> ForwardBatch:
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
            global_cache_loc=self.global_cache_loc[:bs],
            req_slots=self.req_slots[:bs],
            req_slots_np=self.req_slots_np[:bs],
            seq_lens=self.seq_lens[:bs],
            seq_lens_cpu=self.seq_lens_cpu[:bs],
        )

    def capture_one_batch_size(self, bs: int) -> None:
        backend = self.model_runner.attn_backend
        backend.init_forward_metadata_capture_cuda_graph(
            bs, self.req_slots[:bs], self.req_slots_np[:bs], self.seq_lens[:bs], self.seq_lens_cpu[:bs]
        )
        fb = self._static_batch(bs)
        model = self.model_runner.model

        def run_once() -> torch.Tensor:
            return model(fb.input_ids, fb.positions, fb)

        for _ in range(2):
            run_once()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = run_once()
        self.pool = graph.pool()
        self.graphs[bs] = graph
        self.outputs[bs] = out
        logger.info(f"captured decode graph bs={bs}, dummy context {self.seq_lens[:bs].sum()} tokens")  # expect: FC101

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        raw_bs = fb.batch_size
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
        self.input_ids[:raw_bs].copy_(fb.input_ids)
        self.positions[:raw_bs].copy_(fb.positions)
        self.out_cache_loc = fb.out_cache_loc.clone()  # expect: FC107
        self.global_cache_loc[:raw_bs].copy_(fb.global_cache_loc)
        self.req_slots[:raw_bs].copy_(fb.req_slots)
        self.seq_lens[:raw_bs].copy_(fb.seq_lens)
        self.seq_lens_cpu[:raw_bs].copy_(fb.seq_lens_cpu)
        self.req_slots_np[:raw_bs] = fb.req_slots_np
        if raw_bs < bs:
            self.seq_lens[raw_bs:bs].fill_(1)
            self.seq_lens_cpu[raw_bs:bs].fill_(1)
            self.req_slots_np[raw_bs:bs] = -1
        self.model_runner.attn_backend.init_forward_metadata_replay_cuda_graph(
            bs, self.req_slots[:bs], self.req_slots_np[:bs], self.seq_lens[:bs], self.seq_lens_cpu[:bs], raw_bs
        )
        self.graphs[bs].replay()
        return self.outputs[bs][:raw_bs]
