"""Decode CUDA graphs that include sampling, so a replay's token depends only on its own row's inputs."""

from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING, Dict, Optional

import numpy as np
import torch

from bisrv.forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from bisrv.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner"):
        self.model_runner = model_runner
        self.det = model_runner.det
        self.device = model_runner.device
        self.attn_backend = model_runner.attn_backend
        self.capture_bs = sorted(self.det.cuda_graph_bs)
        self.max_bs = self.capture_bs[-1]
        self.attn_backend.init_cuda_graph_state(self.max_bs, self.max_bs)
        self.seq_len_fill_value = self.attn_backend.get_cuda_graph_seq_len_fill_value()

        with torch.device(self.device):
            self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64)
            self.positions = torch.zeros(self.max_bs, dtype=torch.int64)
            self.req_pool_indices = torch.zeros(self.max_bs, dtype=torch.int32)
            self.seq_lens = torch.full((self.max_bs,), self.seq_len_fill_value, dtype=torch.int32)
            self.out_cache_loc = torch.zeros(self.max_bs, dtype=torch.int64)
            self.seeds = torch.zeros(self.max_bs, dtype=torch.int64)
            self.sampling_steps = torch.zeros(self.max_bs, dtype=torch.int64)
            self.temperatures = torch.ones(self.max_bs, dtype=torch.float32)
            self.next_token_ids = torch.zeros(self.max_bs, dtype=torch.int64)
        self.seq_lens_np = np.full(self.max_bs, self.seq_len_fill_value, dtype=np.int32)
        self.last_seeds_cpu: Optional[torch.Tensor] = None
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.graph_memory_pool = None
        self.raw_bs = 0
        self.bs = 0
        self.capture()

    def _static_batch(self, bs: int) -> ForwardBatch:
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            attn_backend=self.attn_backend,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            seq_lens_np=self.seq_lens_np[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
            seeds=self.seeds[:bs],
            sampling_steps=self.sampling_steps[:bs],
            temperatures=self.temperatures[:bs],
        )

    def capture(self) -> None:
        for bs in reversed(self.capture_bs):
            self.graphs[bs] = self.capture_one_batch_size(bs)
        logger.info("captured %d decode graphs with sampling", len(self.graphs))

    def capture_one_batch_size(self, bs: int) -> torch.cuda.CUDAGraph:
        graph = torch.cuda.CUDAGraph()
        fb = self._static_batch(bs)
        self.attn_backend.init_forward_metadata_capture_cuda_graph(
            bs, self.req_pool_indices[:bs], self.seq_lens[:bs], self.seq_lens_np[:bs]
        )
        model = self.model_runner.model
        sampler = self.model_runner.sampler
        out_ids = self.next_token_ids

        def run_once():
            logits = model.forward_decode(fb.input_ids, fb.positions, fb)
            out_ids[:bs].copy_(sampler.sample(logits, fb))

        for _ in range(2):
            torch.cuda.current_stream().synchronize()  # ok: FC101
            run_once()
        with torch.cuda.graph(graph, pool=self.graph_memory_pool):
            run_once()
        self.graph_memory_pool = graph.pool()
        return graph

    def replay_prepare(self, fb: ForwardBatch) -> int:
        raw_bs = fb.batch_size
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
        if bs != raw_bs:
            self.seq_lens.fill_(self.seq_len_fill_value)
            self.out_cache_loc.zero_()
            self.req_pool_indices.zero_()
            self.seq_lens_np[:] = self.seq_len_fill_value
        self.input_ids[:raw_bs].copy_(fb.input_ids)
        self.positions[:raw_bs].copy_(fb.positions)
        self.req_pool_indices[:raw_bs].copy_(fb.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(fb.seq_lens)
        self.out_cache_loc[:raw_bs].copy_(fb.out_cache_loc)
        self.temperatures[:raw_bs].copy_(fb.temperatures)
        self.seq_lens_np[:raw_bs] = fb.seq_lens_np

        prev = self.last_seeds_cpu
        self.last_seeds_cpu = torch.tensor(fb.seed_list, dtype=torch.int64)  # ok: FC107
        if prev is None or not torch.equal(prev, self.last_seeds_cpu):  # ok: FC101
            self.seeds[:raw_bs].copy_(fb.seeds)
        # padded rows sample with step 0
        self.sampling_steps = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)  # expect: FC107
        self.sampling_steps[:raw_bs].copy_(fb.sampling_steps)

        longest = int(self.seq_lens_np[:raw_bs].max())  # ok: FC101
        if longest > self.det.max_context_len:
            raise ValueError(f"sequence of {longest} tokens exceeds the captured context")
        self.attn_backend.init_forward_metadata_replay_cuda_graph(
            bs, raw_bs, self.req_pool_indices[:bs], self.seq_lens[:bs], self.seq_lens_np[:bs]
        )
        self.raw_bs, self.bs = raw_bs, bs
        return bs

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        bs = self.replay_prepare(fb)
        logger.debug(f"replay bs={bs} raw_bs={fb.batch_size} seq_lens={fb.seq_lens}")  # expect: FC101
        self.graphs[bs].replay()
        return self.next_token_ids[: fb.batch_size]
