from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

import torch

from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from sglang.srt.model_executor.model_runner import ModelRunner


class CudaGraphRunner:
    def __init__(self, model_runner: ModelRunner):
        self.model_runner = model_runner
        self.device = model_runner.device
        self.capture_bs = [1, 2, 4, 8, 16, 24, 32, 48, 64]
        self.max_bs = max(self.capture_bs)
        self.graphs = {}
        self.output_buffers = {}
        self.model_runner.attn_backend.init_cuda_graph_state(self.max_bs)
        with torch.device(self.device):
            self.input_ids = torch.zeros((self.max_bs,), dtype=torch.int64)
            self.req_pool_indices = torch.zeros((self.max_bs,), dtype=torch.int64)
            self.seq_lens = torch.full((self.max_bs,), 1, dtype=torch.int32)
            self.out_cache_loc = torch.zeros((self.max_bs,), dtype=torch.int64)
        self.seq_lens_cpu = torch.full((self.max_bs,), 1, dtype=torch.int32)

    def can_run(self, forward_batch: ForwardBatch):
        return forward_batch.batch_size <= self.max_bs

    def capture(self):
        for bs in reversed(self.capture_bs):
            graph, out = self.capture_one_batch_size(bs)
            self.graphs[bs] = graph
            self.output_buffers[bs] = out

    def capture_one_batch_size(self, bs: int):
        graph = torch.cuda.CUDAGraph()
        backend = self.model_runner.attn_backend
        backend.init_forward_metadata_capture_cuda_graph(bs, bs, self.req_pool_indices[:bs], self.seq_lens[:bs], ForwardMode.DECODE)
        forward_batch = ForwardBatch(forward_mode=ForwardMode.DECODE, batch_size=bs, req_pool_indices=self.req_pool_indices[:bs], seq_lens=self.seq_lens[:bs],
                                     seq_lens_cpu=self.seq_lens_cpu[:bs], seq_lens_sum=bs, out_cache_loc=self.out_cache_loc[:bs])
        torch.cuda.synchronize()  # ok: FC101
        with torch.cuda.graph(graph):
            out = self.model_runner.forward_decode(self.input_ids[:bs], forward_batch)
        torch.cuda.synchronize()  # ok: FC101
        return graph, out

    def replay(self, forward_batch: ForwardBatch):
        raw_bs = forward_batch.batch_size
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
        if bs != raw_bs:
            self.seq_lens.fill_(1)
            self.out_cache_loc.zero_()
        self.seq_lens[:raw_bs].copy_(forward_batch.seq_lens)
        self.seq_lens_cpu[:raw_bs].copy_(forward_batch.seq_lens_cpu)  # ok: FC101
        self.req_pool_indices[:raw_bs].copy_(forward_batch.req_pool_indices)
        longest = max(self.seq_lens[:bs])  # expect: FC101
        if longest > self.model_runner.model_config.context_len:
            raise ValueError(f"sequence of {longest} tokens exceeds the context length")
        seq_lens_sum = forward_batch.seq_lens_sum + (bs - raw_bs)
        self.model_runner.attn_backend.init_forward_metadata_replay_cuda_graph(bs, self.req_pool_indices, self.seq_lens, seq_lens_sum, ForwardMode.DECODE, self.seq_lens_cpu)
        self.graphs[bs].replay()
        return self.output_buffers[bs][:raw_bs]
