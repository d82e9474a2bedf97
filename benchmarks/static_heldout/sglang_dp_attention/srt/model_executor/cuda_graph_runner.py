"""Decode graphs per padded global batch size: every DP rank pads to the largest local batch across ranks."""
from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

import torch

from srt.layers.dp_attention import get_attention_dp_rank
from srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from srt.model_executor.model_runner import ModelRunner


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner"):
        self.model_runner, self.attn_backend = model_runner, model_runner.attn_backend
        self.device, self.dp_size = model_runner.device, model_runner.server_args.dp_size
        self.capture_bs = sorted(model_runner.server_args.cuda_graph_bs)
        self.max_bs, self.pool = self.capture_bs[-1], None
        self.attn_backend.init_cuda_graph_state(self.max_bs, self.max_bs * model_runner.context_len)
        with torch.device(self.device):
            self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64)
            self.positions = torch.zeros(self.max_bs, dtype=torch.int64)
            self.req_pool_indices = torch.zeros(self.max_bs, dtype=torch.int32)
            self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32)
            self.global_num_tokens_gpu = torch.zeros(self.dp_size, dtype=torch.int64)
            self.dp_local_start_pos, self.dp_local_num_tokens = torch.zeros((), dtype=torch.int64), torch.zeros((), dtype=torch.int64)
            self.gathered_buffer = torch.zeros(self.max_bs * self.dp_size, model_runner.hidden_size, dtype=torch.bfloat16)
        self.graphs, self.outputs = {}, {}

    def capture(self) -> None:
        for bs in reversed(self.capture_bs):
            self.graphs[bs], self.outputs[bs] = self.capture_one_batch_size(bs)
        torch.cuda.synchronize()  # ok: FC101

    def capture_one_batch_size(self, bs: int):
        self.global_num_tokens_gpu.fill_(bs)
        self.dp_local_start_pos.fill_(get_attention_dp_rank() * bs)
        self.dp_local_num_tokens.fill_(bs)
        fb = ForwardBatch(
            ForwardMode.DECODE, bs, self.input_ids[:bs], self.positions[:bs], self.req_pool_indices[:bs],
            self.seq_lens[:bs], torch.ones(bs, dtype=torch.int32), global_num_tokens_cpu=[bs] * self.dp_size,
            global_num_tokens_gpu=self.global_num_tokens_gpu, dp_local_start_pos=self.dp_local_start_pos,
            dp_local_num_tokens=self.dp_local_num_tokens, gathered_buffer=self.gathered_buffer[: bs * self.dp_size])
        self.attn_backend.init_forward_metadata_capture_cuda_graph(bs, fb.req_pool_indices, fb.seq_lens)
        model = self.model_runner.model

        def run_once():
            return model.forward_decode(fb.input_ids, fb.positions, fb)

        for _ in range(2):
            run_once()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = run_once()
        self.pool = graph.pool()
        return graph, out

    def replay_prepare(self, fb: ForwardBatch) -> int:
        raw_bs = fb.batch_size
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, max(fb.global_num_tokens_cpu))]  # ok: FC101
        self.counts_pinned = torch.tensor([bs] * self.dp_size, dtype=torch.int64).pin_memory()  # ok: FC107
        self.global_num_tokens_gpu.copy_(self.counts_pinned, non_blocking=True)
        self.dp_local_start_pos = torch.full((), get_attention_dp_rank() * bs, dtype=torch.int64, device=self.device)  # expect: FC107
        self.dp_local_num_tokens.fill_(bs)
        for static, fresh in ((self.input_ids, fb.input_ids), (self.positions, fb.positions),
                              (self.req_pool_indices, fb.req_pool_indices), (self.seq_lens.fill_(1), fb.seq_lens)):
            static[:raw_bs].copy_(fresh)
        self.attn_backend.init_forward_metadata_replay_cuda_graph(bs, raw_bs, self.req_pool_indices, self.seq_lens,
                                                                 fb.seq_lens_cpu)
        return bs

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        bs = self.replay_prepare(fb)
        # padded rows decode at position 0 (their outputs are dropped below)
        self.positions[fb.batch_size : bs].zero_()  # ok: FC104
        self.graphs[bs].replay()
        return self.outputs[bs][: fb.batch_size]
