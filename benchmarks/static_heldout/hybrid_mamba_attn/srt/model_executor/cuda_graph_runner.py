"""Decode CUDA graphs, one per batch-size bucket, shared by the linear and full-attention layers."""
from __future__ import annotations

import bisect
import logging
from contextlib import contextmanager
from typing import TYPE_CHECKING, Dict, Tuple

import torch

from srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from srt.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)


@contextmanager
def graph_capture_stream(device):
    stream = torch.cuda.Stream(device=device)
    current = torch.cuda.current_stream(device)
    stream.wait_stream(current)
    with torch.cuda.stream(stream):
        yield stream
    current.wait_stream(stream)


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner"):
        self.model_runner = model_runner
        self.device = model_runner.device
        args = model_runner.server_args
        self.capture_bs = [1, 2, 4, 8] + list(range(16, args.cuda_graph_max_bs + 1, 16))
        self.max_bs = max(self.capture_bs)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.output_buffers: Dict[int, torch.Tensor] = {}
        self.graph_pool = None

        attn_backend = model_runner.attn_backend
        self.seq_len_fill_value = attn_backend.get_cuda_graph_seq_len_fill_value()
        attn_backend.init_cuda_graph_state(self.max_bs, self.max_bs)
        with torch.device(self.device):
            self.input_ids = torch.zeros((self.max_bs,), dtype=torch.int64)
            self.positions = torch.zeros((self.max_bs,), dtype=torch.int64)
            self.req_pool_indices = torch.zeros((self.max_bs,), dtype=torch.int32)
            self.seq_lens = torch.full((self.max_bs,), self.seq_len_fill_value, dtype=torch.int32)
            self.out_cache_loc = torch.zeros((self.max_bs,), dtype=torch.int64)
        self.seq_lens_cpu = torch.full((self.max_bs,), self.seq_len_fill_value, dtype=torch.int32)
        self.capture()

    def can_run(self, forward_batch: ForwardBatch) -> bool:
        return forward_batch.forward_mode.is_decode() and forward_batch.batch_size <= self.max_bs

    def capture(self) -> None:
        with graph_capture_stream(self.device) as stream:
            for bs in reversed(self.capture_bs):
                graph, out = self.capture_one_batch_size(bs, stream)
                self.graphs[bs] = graph
                self.output_buffers[bs] = out
        logger.info("captured %d decode graphs (max bs %d)", len(self.graphs), self.max_bs)

    def capture_one_batch_size(self, bs: int, stream) -> Tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        graph = torch.cuda.CUDAGraph()
        attn_backend = self.model_runner.attn_backend
        forward_batch = ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=self.input_ids[:bs],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
            seq_lens_sum=bs * self.seq_len_fill_value,
            positions=self.positions[:bs],
            seq_lens_cpu=self.seq_lens_cpu[:bs],
            attn_backend=attn_backend,
        )
        attn_backend.init_forward_metadata_capture_cuda_graph(
            bs, bs, forward_batch.req_pool_indices, forward_batch.seq_lens, None, ForwardMode.DECODE, None
        )
        model = self.model_runner.model

        def run_once():
            return model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)

        for _ in range(2):
            torch.cuda.synchronize()  # ok: FC101
            run_once()
        with torch.cuda.graph(graph, pool=self.graph_pool, stream=stream):
            out = run_once()
        self.graph_pool = graph.pool()
        return graph, out

    def replay_prepare(self, forward_batch: ForwardBatch) -> int:
        raw_bs = forward_batch.batch_size
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
        if bs != raw_bs:
            self.seq_lens.fill_(self.seq_len_fill_value)
            self.seq_lens_cpu.fill_(self.seq_len_fill_value)
            self.out_cache_loc.zero_()
        self.input_ids[:raw_bs].copy_(forward_batch.input_ids)
        self.req_pool_indices[:raw_bs].copy_(forward_batch.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(forward_batch.seq_lens)  # ok: FC107
        self.out_cache_loc[:raw_bs].copy_(forward_batch.out_cache_loc)
        self.positions[:raw_bs].copy_(forward_batch.positions)
        seq_lens_cpu = forward_batch.seq_lens_cpu
        if seq_lens_cpu is None:
            seq_lens_cpu = forward_batch.seq_lens.cpu()  # expect: FC101
        self.seq_lens_cpu[:raw_bs].copy_(seq_lens_cpu)  # ok: FC101
        padded_sum = forward_batch.seq_lens_sum + (bs - raw_bs) * self.seq_len_fill_value
        self.model_runner.attn_backend.init_forward_metadata_replay_cuda_graph(
            bs,
            self.req_pool_indices,
            self.seq_lens,
            padded_sum,
            None,
            ForwardMode.DECODE,
            None,
            self.seq_lens_cpu,
            num_real=raw_bs,
        )
        return bs

    def replay(self, forward_batch: ForwardBatch) -> torch.Tensor:
        bs = self.replay_prepare(forward_batch)
        self.graphs[bs].replay()
        return self.output_buffers[bs][: forward_batch.batch_size]
