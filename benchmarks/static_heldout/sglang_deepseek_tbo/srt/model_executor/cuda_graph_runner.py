"""CUDA graph runner for DeepSeek-V3 decode (or speculative verify), aware of TBO and DP attention."""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Dict, Tuple

import torch

from srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from srt.two_batch_overlap import TboCudaGraphRunnerPlugin

if TYPE_CHECKING:
    from srt.model_executor.model_runner import ModelRunner


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner"):
        self.model_runner = model_runner
        self.device = model_runner.device
        args = model_runner.server_args
        self.capture_bs = sorted(args.cuda_graph_bs)
        self.max_bs = self.capture_bs[-1]
        self.dp_size = args.dp_size
        if args.speculative_num_draft_tokens:
            self.capture_forward_mode = ForwardMode.TARGET_VERIFY
            self.num_tokens_per_bs = args.speculative_num_draft_tokens
        else:
            self.capture_forward_mode = ForwardMode.DECODE
            self.num_tokens_per_bs = 1
        self.max_num_token = self.max_bs * self.num_tokens_per_bs
        model_runner.attn_backend.init_cuda_graph_state(self.max_bs, self.max_num_token)

        self.input_ids = torch.zeros((self.max_num_token,), dtype=torch.int64, device=self.device)
        self.positions = torch.zeros((self.max_num_token,), dtype=torch.int64, device=self.device)
        self.out_cache_loc = torch.zeros((self.max_num_token,), dtype=torch.int64, device=self.device)
        self.req_pool_indices = torch.zeros((self.max_bs,), dtype=torch.int32, device=self.device)
        self.seq_lens = torch.ones((self.max_bs,), dtype=torch.int32, device=self.device)
        self.seq_lens_cpu = torch.ones((self.max_bs,), dtype=torch.int32)
        self.global_num_tokens_gpu = torch.zeros((self.dp_size,), dtype=torch.int32, device=self.device)
        self.out_staging = None

        self.tbo_plugin = TboCudaGraphRunnerPlugin(args.enable_two_batch_overlap, self.dp_size)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.output_buffers: Dict[int, torch.Tensor] = {}
        self.bs = self.raw_bs = self.raw_num_token = 0
        self.capture()

    def can_run(self, forward_batch: ForwardBatch) -> bool:
        return forward_batch.batch_size <= self.max_bs and forward_batch.forward_mode == self.capture_forward_mode

    def capture(self) -> None:
        for bs in reversed(self.capture_bs):
            self.graphs[bs], self.output_buffers[bs] = self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> Tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        num_tokens = bs * self.num_tokens_per_bs
        forward_batch = ForwardBatch(
            forward_mode=self.capture_forward_mode,
            batch_size=bs,
            input_ids=self.input_ids[:num_tokens],
            positions=self.positions[:num_tokens],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            out_cache_loc=self.out_cache_loc[:num_tokens],
            seq_lens_sum=bs,
            seq_lens_cpu=self.seq_lens_cpu[:bs],
            global_num_tokens_cpu=[num_tokens] * self.dp_size,
            global_num_tokens_gpu=self.global_num_tokens_gpu,
            attn_backend=self.model_runner.attn_backend,
        )
        self.global_num_tokens_gpu.fill_(num_tokens)
        self.tbo_plugin.capture_one_batch_size(forward_batch, num_tokens)
        self.model_runner.attn_backend.init_forward_metadata_capture_cuda_graph(
            bs, num_tokens, forward_batch.req_pool_indices, forward_batch.seq_lens, forward_batch.forward_mode
        )
        model = self.model_runner.model

        def run_once() -> torch.Tensor:
            return model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)

        for _ in range(2):
            torch.cuda.synchronize()  # ok: FC101
            run_once()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.model_runner.graph_mempool):
            out = run_once()
        return graph, out

    def replay_prepare(self, forward_batch: ForwardBatch) -> None:
        raw_bs = forward_batch.batch_size
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
        raw_num_token = raw_bs * self.num_tokens_per_bs
        if bs != raw_bs:
            self.seq_lens.fill_(1)
            self.seq_lens_cpu.fill_(1)
            self.out_cache_loc.zero_()
        self.input_ids[:raw_num_token].copy_(forward_batch.input_ids)
        self.positions[:raw_num_token].copy_(forward_batch.positions)
        self.req_pool_indices[:raw_bs].copy_(forward_batch.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(forward_batch.seq_lens)
        self.seq_lens_cpu[:raw_bs].copy_(forward_batch.seq_lens_cpu)
        if self.dp_size > 1:
            # every rank pads to the same captured size so that the MoE gathers line up
            padded = max(forward_batch.global_num_tokens_cpu)
            if padded > self.out_cache_loc.numel():
                self.out_cache_loc = torch.zeros((padded,), dtype=torch.int64, device=self.device)  # expect: FC107
            self.global_num_tokens_gpu.fill_(bs * self.num_tokens_per_bs)
        self.out_cache_loc[:raw_num_token].copy_(forward_batch.out_cache_loc)
        self.tbo_plugin.replay_prepare(forward_batch, bs)
        self.model_runner.attn_backend.init_forward_metadata_replay_cuda_graph(
            bs,
            raw_bs,
            self.req_pool_indices[:bs],
            self.seq_lens[:bs],
            self.seq_lens_cpu[:bs],
            self.capture_forward_mode,
        )
        self.bs, self.raw_bs, self.raw_num_token = bs, raw_bs, raw_num_token

    def replay(self, forward_batch: ForwardBatch) -> torch.Tensor:
        self.replay_prepare(forward_batch)
        self.graphs[self.bs].replay()
        out = self.output_buffers[self.bs]
        if self.out_staging is None:
            # hand results out of the graph pool: the overlap scheduler reads them after the next replay starts
            self.out_staging = torch.empty_like(self.output_buffers[self.max_bs])  # ok: FC107
        staged = self.out_staging[: self.raw_num_token]
        staged.copy_(out[: self.raw_num_token])
        return staged
