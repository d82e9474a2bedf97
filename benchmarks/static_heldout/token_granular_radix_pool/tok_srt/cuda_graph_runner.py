from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Dict

import torch

from tok_srt.forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from tok_srt.model_runner import ModelRunner


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner"):
        self.model_runner = model_runner
        self.attn_backend = model_runner.attn_backend
        self.device = model_runner.device
        args = model_runner.server_args
        self.capture_bs = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160]
        self.capture_bs = [bs for bs in self.capture_bs if bs <= args.max_running_requests]
        self.max_bs = self.capture_bs[-1]
        self.num_tokens_per_bs = args.speculative_num_draft_tokens or 1
        self.capture_forward_mode = (
            ForwardMode.TARGET_VERIFY if args.speculative_num_draft_tokens else ForwardMode.DECODE
        )
        self.max_num_token = self.max_bs * self.num_tokens_per_bs
        self.seq_len_fill_value = 1
        self.attn_backend.init_cuda_graph_state(self.max_bs, self.max_num_token)
        with torch.device(self.device):
            self.input_ids = torch.zeros((self.max_num_token,), dtype=torch.int64)
            self.positions = torch.zeros((self.max_num_token,), dtype=torch.int64)
            self.out_cache_loc = torch.zeros((self.max_num_token,), dtype=torch.int64)
            self.req_pool_indices = torch.zeros((self.max_bs,), dtype=torch.int64)
            self.seq_lens = torch.full((self.max_bs,), self.seq_len_fill_value, dtype=torch.int32)
        self.seq_lens_cpu = torch.full((self.max_bs,), self.seq_len_fill_value, dtype=torch.int32, pin_memory=True)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool = None
        self.bs = self.raw_bs = 0

    def can_run(self, fb: ForwardBatch) -> bool:
        return fb.forward_mode == self.capture_forward_mode and fb.batch_size <= self.max_bs

    def capture(self) -> None:
        for bs in reversed(self.capture_bs):
            graph, out = self.capture_one_batch_size(bs)
            self.graphs[bs] = graph
            self.outputs[bs] = out

    def capture_one_batch_size(self, bs: int):
        num_tokens = bs * self.num_tokens_per_bs
        fb = ForwardBatch(
            forward_mode=self.capture_forward_mode,
            batch_size=bs,
            input_ids=self.input_ids[:num_tokens],
            positions=self.positions[:num_tokens],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            seq_lens_cpu=self.seq_lens_cpu[:bs],
            seq_lens_sum=bs * self.seq_len_fill_value,
            out_cache_loc=self.out_cache_loc[:num_tokens],
            attn_backend=self.attn_backend,
            token_to_kv_pool=self.model_runner.token_to_kv_pool,
        )
        self.attn_backend.init_forward_metadata_capture_cuda_graph(
            bs, num_tokens, fb.req_pool_indices, fb.seq_lens, fb.seq_lens_cpu, self.capture_forward_mode
        )
        model = self.model_runner.model

        def run_once():
            return model.forward(fb.input_ids, fb.positions, fb)

        for _ in range(2):
            torch.cuda.synchronize()  # ok: FC101
            run_once()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = run_once()
        self.pool = graph.pool()
        return graph, out

    def replay_prepare(self, fb: ForwardBatch) -> None:
        raw_bs = fb.batch_size
        raw_num_token = raw_bs * self.num_tokens_per_bs
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
        if bs != raw_bs:
            # padded rows: one token in the padding slot
            self.seq_lens = torch.full((self.max_bs,), self.seq_len_fill_value, dtype=torch.int32, device=self.device)  # expect: FC107
            self.req_pool_indices.zero_()
            self.out_cache_loc.zero_()
        if raw_num_token > self.out_cache_loc.numel():
            self.out_cache_loc = torch.zeros(raw_num_token, dtype=torch.int64, device=self.device)  # expect: FC107
        self.input_ids[:raw_num_token].copy_(fb.input_ids)
        self.positions[:raw_num_token].copy_(fb.positions)
        self.out_cache_loc[:raw_num_token].copy_(fb.out_cache_loc)
        self.req_pool_indices[:raw_bs].copy_(fb.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(fb.seq_lens)
        self.seq_lens_cpu.fill_(self.seq_len_fill_value)
        self.seq_lens_cpu[:raw_bs].copy_(fb.seq_lens_cpu)
        self.attn_backend.init_forward_metadata_replay_cuda_graph(
            bs,
            raw_bs,
            self.req_pool_indices,
            self.seq_lens,
            self.seq_lens_cpu,
            self.capture_forward_mode,
            bs * self.num_tokens_per_bs,
        )
        self.raw_bs = raw_bs
        self.bs = bs

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        self.replay_prepare(fb)
        self.graphs[self.bs].replay()
        return self.outputs[self.bs][: self.raw_bs * self.num_tokens_per_bs]
