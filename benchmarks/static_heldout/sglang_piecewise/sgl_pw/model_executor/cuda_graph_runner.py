"""Decode CUDA graphs (one per padded batch size)."""

from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING

import torch

from sgl_pw.forward_context import set_forward_context
from sgl_pw.model_executor.forward_batch_info import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from sgl_pw.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner"):
        self.model_runner = model_runner
        self.device = model_runner.device
        self.graph_pool = model_runner.graph_pool
        self.capture_bs = list(model_runner.server_args.cuda_graph_bs)
        self.max_bs = max(self.capture_bs)
        self.seq_len_fill_value = 1
        self.attention_layers = [layer.attn for layer in model_runner.model.layers]
        model_runner.attn_backend.init_cuda_graph_state(self.max_bs, self.max_bs)
        with torch.device(self.device):
            self.input_ids = torch.zeros((self.max_bs,), dtype=torch.int64)
            self.req_pool_indices = torch.zeros((self.max_bs,), dtype=torch.int64)
            self.seq_lens = torch.full((self.max_bs,), self.seq_len_fill_value, dtype=torch.int32)
            self.out_cache_loc = torch.zeros((self.max_bs,), dtype=torch.int64)
            self.positions = torch.zeros((self.max_bs,), dtype=torch.int64)
        self.seq_lens_cpu = torch.full((self.max_bs,), self.seq_len_fill_value, dtype=torch.int32)
        self.graphs: dict = {}
        self.output_buffers: dict = {}
        self.capture()

    def capture(self):
        for bs in reversed(self.capture_bs):
            graph, output = self.capture_one_batch_size(bs, self.model_runner.model.forward)
            self.graphs[bs] = graph
            self.output_buffers[bs] = output

    def capture_one_batch_size(self, bs: int, forward):
        graph = torch.cuda.CUDAGraph()
        forward_batch = ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=self.input_ids[:bs],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
            seq_lens_sum=bs * self.seq_len_fill_value,
            positions=self.positions[:bs],
            req_to_token_pool=self.model_runner.req_to_token_pool,
            token_to_kv_pool=self.model_runner.token_to_kv_pool,
            attn_backend=self.model_runner.attn_backend,
        )
        self.model_runner.attn_backend.init_forward_metadata_capture_cuda_graph(
            bs, bs, forward_batch.req_pool_indices, forward_batch.seq_lens, None, ForwardMode.DECODE, None
        )

        def run_once():
            with set_forward_context(forward_batch, self.attention_layers):
                return forward(forward_batch.input_ids, forward_batch.positions, forward_batch)

        for _ in range(2):
            torch.cuda.synchronize()  # ok: FC101
            run_once()
        with torch.cuda.graph(graph, pool=self.graph_pool):
            out = run_once()
        return graph, out

    def replay_prepare(self, forward_batch: ForwardBatch):
        raw_bs = forward_batch.batch_size
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
        if bs != raw_bs:
            self.seq_lens.fill_(self.seq_len_fill_value)
            self.out_cache_loc.zero_()
        self.input_ids[:raw_bs].copy_(forward_batch.input_ids)
        self.req_pool_indices[:raw_bs].copy_(forward_batch.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(forward_batch.seq_lens)
        self.out_cache_loc[:raw_bs].copy_(forward_batch.out_cache_loc)
        self.positions[:raw_bs].copy_(forward_batch.positions)
        self.seq_lens_cpu.fill_(self.seq_len_fill_value)
        self.seq_lens_cpu[:raw_bs].copy_(forward_batch.seq_lens_cpu)  # ok: FC101
        self.model_runner.attn_backend.init_forward_metadata_replay_cuda_graph(
            bs,
            self.req_pool_indices,
            self.seq_lens,
            forward_batch.seq_lens_sum + (bs - raw_bs) * self.seq_len_fill_value,
            None,
            ForwardMode.DECODE,
            None,
            seq_lens_cpu=self.seq_lens_cpu,
            raw_bs=raw_bs,
        )
        self.raw_bs = raw_bs
        self.bs = bs

    def replay(self, forward_batch: ForwardBatch) -> torch.Tensor:
        self.replay_prepare(forward_batch)
        self.graphs[self.bs].replay()
        return self.output_buffers[self.bs][: self.raw_bs]
