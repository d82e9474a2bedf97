"""Captures decode, or NGRAM target-verify, for each batch size."""
from __future__ import annotations

import bisect

import torch

from .forward_batch_info import ForwardBatch, ForwardMode, NgramVerifyInput


class CudaGraphRunner:
    _STATIC_INPUTS = ("input_ids", "positions", "out_cache_loc")

    def __init__(self, model_runner) -> None:
        self.model_runner, self.backend = model_runner, model_runner.attn_backend
        args = model_runner.server_args
        self.mode = ForwardMode.TARGET_VERIFY if args.speculative_algorithm == "NGRAM" else ForwardMode.DECODE
        self.num_draft = args.speculative_num_draft_tokens if self.mode.is_target_verify() else 1
        self.capture_bs = sorted(args.cuda_graph_bs)
        self.max_bs = self.capture_bs[-1]
        self.backend.init_cuda_graph_state(self.max_bs, args.context_len, self.num_draft)
        t = self.max_bs * self.num_draft
        with torch.device(model_runner.device):
            self.input_ids = torch.zeros(t, dtype=torch.int64)
            self.positions = torch.zeros(t, dtype=torch.int64)
            self.out_cache_loc = torch.zeros(t, dtype=torch.int64)
            self.req_pool_indices = torch.zeros(self.max_bs, dtype=torch.int32)
            self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32)
            self.capture_mask = torch.ones(t * (self.num_draft + 1), dtype=torch.bool)
        self.seq_lens_cpu = torch.ones(self.max_bs, dtype=torch.int32)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def _batch(self, bs: int, spec_info) -> ForwardBatch:
        t = bs * self.num_draft
        return ForwardBatch(
            self.mode, bs, self.input_ids[:t], self.positions[:t], self.req_pool_indices[:bs], self.seq_lens[:bs],
            self.seq_lens_cpu[:bs], self.out_cache_loc[:t], self.backend, self.model_runner.token_to_kv_pool, spec_info,
        )

    def capture(self) -> None:
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.capture_bs):
            self.graphs[bs], self.outputs[bs] = self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int):
        t = bs * self.num_draft
        spec = None
        if self.mode.is_target_verify():
            spec = NgramVerifyInput(self.input_ids[:t], self.positions[:t], self.capture_mask[: t * (self.num_draft + 1)], self.num_draft)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, self.req_pool_indices[:bs], self.seq_lens[:bs], self.seq_lens_cpu[:bs], self.mode, spec)
        fb = self._batch(bs, spec)
        model = self.model_runner.model
        for _ in range(2):
            model.forward(fb.input_ids, fb.positions, fb)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model.forward(fb.input_ids, fb.positions, fb)
        return graph, out

    def replay_prepare(self, fb: ForwardBatch) -> int:
        raw_bs = fb.batch_size
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
        if bs != raw_bs:
            self.seq_lens.fill_(1)
            self.seq_lens_cpu.fill_(1)
        for name in self._STATIC_INPUTS:
            setattr(self, name, getattr(fb, name).clone())  # expect: FC107
        self.req_pool_indices[:raw_bs].copy_(fb.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(fb.seq_lens)
        self.seq_lens_cpu[:raw_bs].copy_(fb.seq_lens_cpu)
        self.backend.init_forward_metadata_replay_cuda_graph(
            bs, self.req_pool_indices[:bs], self.seq_lens[:bs], self.seq_lens_cpu[:bs], self.mode, fb.spec_info
        )
        return bs

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        bs = self.replay_prepare(fb)
        self.graphs[bs].replay()
        return self.outputs[bs][: fb.batch_size * self.num_draft]
