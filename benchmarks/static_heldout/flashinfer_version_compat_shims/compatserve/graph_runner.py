"""Decode CUDA graphs, one per batch-size bucket."""

from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING, Dict, Sequence

import numpy as np
import torch

from compatserve import compat
from compatserve.forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from compatserve.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner", capture_bs: Sequence[int]):
        cfg = model_runner.cfg
        assert all(0 < b <= cfg.max_batch_size for b in capture_bs), capture_bs  # expect: FC109
        self.model_runner = model_runner
        self.attn_backend = model_runner.attn_backend
        self.cfg = cfg
        self.device = model_runner.device
        self.capture_bs = sorted(set(capture_bs))
        self.max_bs = self.capture_bs[-1]
        self.max_num_tokens = self.max_bs
        self.seq_len_fill_value = 1
        self._use_cuda_graph = not cfg.disable_cuda_graph  # ok: FC103

        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool = None
        self.stream = torch.cuda.Stream()

        # static inputs the graphs read by address
        n = self.max_num_tokens
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=self.device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=self.device)
        self.out_cache_loc = torch.zeros(n, dtype=torch.int64, device=self.device)
        self.req_pool_indices = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.seq_lens = torch.full((self.max_bs,), self.seq_len_fill_value, dtype=torch.int32, device=self.device)
        self.seq_lens_cpu = torch.full((self.max_bs,), self.seq_len_fill_value, dtype=torch.int32, pin_memory=True)

        self.attn_backend.init_cuda_graph_state(self.max_bs)
        self.capture()

    # ------------------------------------------------------------------------------------
    # capture
    # ------------------------------------------------------------------------------------

    def capture(self) -> None:
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.capture_bs):
            graph, out = self.capture_one_batch_size(bs)
            self.graphs[bs] = graph
            self.outputs[bs] = out
            if self.pool is None:
                self.pool = graph.pool()
        torch.cuda.synchronize()
        logger.info("captured %d decode graphs with flashinfer %s", len(self.graphs), compat.FLASHINFER_VERSION)

    def _static_batch(self, bs: int) -> ForwardBatch:
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
            seq_lens_cpu=self.seq_lens_cpu[:bs],
            seq_lens_np=np.full(bs, self.seq_len_fill_value, dtype=np.int32),
        )

    def capture_one_batch_size(self, bs: int):
        graph = torch.cuda.CUDAGraph()
        fb = self._static_batch(bs)
        self.attn_backend.init_forward_metadata_capture_cuda_graph(
            bs, self.req_pool_indices[:bs], self.seq_lens[:bs], self.seq_lens_cpu[:bs], ForwardMode.DECODE
        )
        model = self.model_runner.model

        def run_once() -> torch.Tensor:
            return model.forward_decode(fb.input_ids, fb.positions, fb)

        with torch.cuda.stream(self.stream):
            for _ in range(2):
                run_once()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            out = run_once()
        return graph, out

    # ------------------------------------------------------------------------------------
    # replay
    # ------------------------------------------------------------------------------------

    def can_run(self, fb: ForwardBatch) -> bool:
        return self._use_cuda_graph and fb.forward_mode.is_decode() and fb.batch_size <= self.max_bs

    def _bucket_for(self, raw_bs: int) -> int:
        idx = bisect.bisect_left(self.capture_bs, raw_bs)
        if idx == len(self.capture_bs):
            raise ValueError(f"batch of {raw_bs} exceeds the largest captured bucket {self.max_bs}")
        return self.capture_bs[idx]

    def replay_prepare(self, fb: ForwardBatch) -> int:
        raw_bs = fb.batch_size
        bs = self._bucket_for(raw_bs)

        # FlashInfer 0.1.6's rope kernel wants int32 positions
        if self.positions.dtype != compat.ROPE_POS_DTYPE:
            self.positions = torch.zeros(self.max_num_tokens, dtype=compat.ROPE_POS_DTYPE, device=self.device)  # expect: FC107

        if bs != raw_bs:
            self.seq_lens[raw_bs:bs].fill_(self.seq_len_fill_value)
            self.seq_lens_cpu[raw_bs:bs].fill_(self.seq_len_fill_value)
            self.out_cache_loc[raw_bs:bs].zero_()
        self.input_ids[:raw_bs].copy_(fb.input_ids)  # ok: FC107
        self.positions[:raw_bs].copy_(fb.positions)
        self.req_pool_indices[:raw_bs].copy_(fb.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(fb.seq_lens)
        self.seq_lens_cpu[:raw_bs].copy_(fb.seq_lens_cpu)  # ok: FC101
        self.out_cache_loc[:raw_bs].copy_(fb.out_cache_loc)

        if not compat.PLAN_RUN_API:
            # 0.1.6's CUDA-graph wrapper fixes its batch size at construction
            w = self.attn_backend.graph_decode_wrappers[bs]
            if w._fixed_batch_size != bs:  # expect: FC103
                raise RuntimeError(f"graph wrapper for bucket {bs} was built for another batch size")

        self.attn_backend.init_forward_metadata_replay_cuda_graph(
            bs, raw_bs, self.req_pool_indices[:bs], self.seq_lens[:bs], self.seq_lens_cpu[:bs], ForwardMode.DECODE
        )
        return bs

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        assert self.graphs, "capture() must run before replay()"  # ok: FC109
        if fb.input_ids.shape[0] > self.input_ids.shape[0]:
            self.input_ids = torch.zeros(fb.input_ids.shape[0], dtype=torch.int64, device=self.device)  # expect: FC107
        bs = self.replay_prepare(fb)
        self.graphs[bs].replay()
        return self.outputs[bs][: fb.batch_size]
