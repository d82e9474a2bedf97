"""Decode CUDA graphs per batch size; M-RoPE positions are read straight from the positions builder."""
from __future__ import annotations

import bisect

import torch

from ..layers import clamp_pages_
from .forward_batch import ForwardBatch, ForwardMode


class CudaGraphRunner:
    def __init__(self, model_runner) -> None:
        self.model_runner = model_runner
        self.backend = model_runner.attn_backend
        self.capture_bs = sorted(model_runner.server_args.cuda_graph_bs)
        self.max_bs = self.capture_bs[-1]
        self.backend.init_cuda_graph_state(self.max_bs, model_runner.server_args.context_len)
        with torch.device(model_runner.device):
            self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64)
            self.req_pool_indices = torch.zeros(self.max_bs, dtype=torch.int32)
            self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32)
            self.out_cache_loc = torch.zeros(self.max_bs, dtype=torch.int64)
        self.seq_lens_cpu = torch.ones(self.max_bs, dtype=torch.int32)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None

    def capture(self) -> None:
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.capture_bs):
            self.graphs[bs], self.outputs[bs] = self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int):
        model = self.model_runner.model
        positions = self.model_runner.mrope_builder.positions[:, :bs]
        # the rotary table must cover every position the graph will see
        model.rotary_emb.ensure_cos_sin_cache(int(positions.max()) + 1)  # expect: FC101
        self.backend.init_forward_metadata_capture_cuda_graph(bs, self.req_pool_indices[:bs], self.seq_lens[:bs], self.seq_lens_cpu[:bs])
        fb = ForwardBatch(
            ForwardMode.DECODE, bs, self.input_ids[:bs], self.req_pool_indices[:bs], self.seq_lens[:bs], self.seq_lens_cpu[:bs],
            self.out_cache_loc[:bs], self.backend, self.model_runner.token_to_kv_pool, mrope_positions=positions,
        )

        def run_once():
            return model.forward(self.input_ids[:bs], positions, fb)

        for _ in range(2):
            run_once()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = run_once()
        self.pool = graph.pool()
        return graph, out

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        raw_bs = fb.batch_size
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
        if bs != raw_bs:
            self.seq_lens.fill_(1)
            self.seq_lens_cpu.fill_(1)
            self.out_cache_loc.zero_()
        self.input_ids[:raw_bs].copy_(fb.input_ids)
        self.req_pool_indices[:raw_bs].copy_(fb.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(fb.seq_lens)
        self.seq_lens_cpu[:raw_bs].copy_(fb.seq_lens_cpu)
        self.out_cache_loc[:raw_bs].copy_(fb.out_cache_loc)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, self.req_pool_indices[:bs], self.seq_lens[:bs], self.seq_lens_cpu[:bs])
        clamp_pages_(self.backend.cuda_graph_kv_indices, self.model_runner.token_to_kv_pool.size)  # expect: FC104
        self.graphs[bs].replay()
        return self.outputs[bs][:raw_bs]
