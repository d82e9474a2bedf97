"""Captures decode (or target-verify) graphs per batch size, with the LoRA inputs they read."""

import bisect
from typing import TYPE_CHECKING, Dict, Optional

import torch

from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from sglang.srt.model_executor.model_runner import ModelRunner


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner"):
        self.model_runner = model_runner
        self.device = model_runner.device
        self.capture_bs = [1, 2, 4, 8, 16, 24, 32]
        self.max_bs = self.capture_bs[-1]
        if model_runner.spec_num_draft_tokens > 1:
            self.capture_forward_mode = ForwardMode.TARGET_VERIFY
            self.num_tokens_per_bs = model_runner.spec_num_draft_tokens
        else:
            self.capture_forward_mode = ForwardMode.DECODE
            self.num_tokens_per_bs = 1
        self.max_num_token = self.max_bs * self.num_tokens_per_bs
        self.enable_lora = model_runner.lora_manager is not None
        self.seq_len_fill_value = 1
        model_runner.attn_backend.init_cuda_graph_state(self.max_bs, self.max_num_token)

        with torch.device(self.device):
            self.input_ids = torch.zeros((self.max_num_token,), dtype=torch.int64)
            self.req_pool_indices = torch.zeros((self.max_bs,), dtype=torch.int32)
            self.seq_lens = torch.full((self.max_bs,), self.seq_len_fill_value, dtype=torch.int32)
            self.out_cache_loc = torch.zeros((self.max_num_token,), dtype=torch.int64)
            self.positions = torch.zeros((self.max_num_token,), dtype=torch.int64)
            self.lora_buffer_ids = torch.zeros((self.max_bs,), dtype=torch.int32)
        self.seq_lens_cpu = torch.full((self.max_bs,), self.seq_len_fill_value, dtype=torch.int32)
        self.lora_scalings: Optional[torch.Tensor] = None
        if self.enable_lora:
            model_runner.lora_manager.init_cuda_graph_batch_info(self.max_bs, model_runner.attn_backend)

        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.output_buffers: Dict[int, torch.Tensor] = {}
        self.bs = self.raw_bs = self.raw_num_token = 0
        self.capture()

    def can_run(self, forward_batch: ForwardBatch) -> bool:
        return forward_batch.forward_mode == self.capture_forward_mode and forward_batch.batch_size <= self.max_bs

    def capture(self) -> None:
        for bs in reversed(self.capture_bs):
            graph, output = self.capture_one_batch_size(bs)
            self.graphs[bs] = graph
            self.output_buffers[bs] = output

    def capture_one_batch_size(self, bs: int):
        graph = torch.cuda.CUDAGraph()
        num_tokens = bs * self.num_tokens_per_bs
        input_ids = self.input_ids[:num_tokens]
        req_pool_indices = self.req_pool_indices[:bs]
        seq_lens = self.seq_lens[:bs]
        positions = self.positions[:num_tokens]
        attn_backend = self.model_runner.attn_backend
        forward_batch = ForwardBatch(
            forward_mode=self.capture_forward_mode,
            batch_size=bs,
            input_ids=input_ids,
            req_pool_indices=req_pool_indices,
            seq_lens=seq_lens,
            seq_lens_cpu=self.seq_lens_cpu[:bs],
            seq_lens_sum=bs * self.seq_len_fill_value,
            out_cache_loc=self.out_cache_loc[:num_tokens],
            positions=positions,
            spec_num_draft_tokens=self.num_tokens_per_bs,
            lora_buffer_ids=self.lora_buffer_ids[:bs],
            attn_backend=attn_backend,
            token_to_kv_pool=self.model_runner.token_to_kv_pool,
        )
        attn_backend.init_forward_metadata_capture_cuda_graph(
            bs,
            num_tokens,
            req_pool_indices,
            seq_lens,
            self.seq_lens_cpu[:bs],
            self.capture_forward_mode,
            self.num_tokens_per_bs,
        )
        if self.enable_lora:
            forward_batch.lora_paths = [None] * bs
            self.model_runner.lora_manager.prepare_lora_batch(forward_batch)

        model = self.model_runner.model

        def run_once():
            return model.forward(input_ids, positions, forward_batch)

        for _ in range(2):
            torch.cuda.synchronize()  # ok: FC101
            run_once()
        with torch.cuda.graph(graph, pool=self.model_runner.graph_memory_pool):
            out = run_once()
        self.model_runner.graph_memory_pool = graph.pool()
        return graph, out

    def replay_prepare(self, forward_batch: ForwardBatch) -> None:
        raw_bs = forward_batch.batch_size
        raw_num_token = raw_bs * self.num_tokens_per_bs
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
        if bs != raw_bs:
            self.seq_lens.fill_(self.seq_len_fill_value)
            self.out_cache_loc.zero_()
        self.input_ids[:raw_num_token].copy_(forward_batch.input_ids)
        self.req_pool_indices[:raw_bs].copy_(forward_batch.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(forward_batch.seq_lens)
        self.out_cache_loc[:raw_num_token].copy_(forward_batch.out_cache_loc)
        self.positions[:raw_num_token].copy_(forward_batch.positions)
        self.seq_lens_cpu.fill_(self.seq_len_fill_value)
        self.seq_lens_cpu[:raw_bs].copy_(forward_batch.seq_lens_cpu)
        longest = forward_batch.seq_lens_cpu.max().item()  # ok: FC101
        if longest >= self.model_runner.model_config.context_len:
            raise ValueError(f"sequence of {longest} tokens exceeds the context length")
        seq_lens_sum = self.seq_lens[:bs].sum().item()  # expect: FC101
        if self.enable_lora:
            # adapter slot of every padded row; the LoRA layers of the graph gather their weights with it
            self.lora_buffer_ids = torch.full((bs,), -1, dtype=torch.int32, device=self.device)  # expect: FC107
            self.lora_buffer_ids[:raw_bs].copy_(forward_batch.lora_buffer_ids, non_blocking=True)
            if self.lora_scalings is None:
                self.lora_scalings = torch.ones(self.max_bs, dtype=torch.float32, device=self.device)  # ok: FC107
        self.model_runner.attn_backend.init_forward_metadata_replay_cuda_graph(
            bs,
            self.req_pool_indices,
            self.seq_lens,
            seq_lens_sum,
            self.capture_forward_mode,
            forward_batch.spec_info,
            self.seq_lens_cpu,
            self.num_tokens_per_bs,
        )
        self.raw_bs = raw_bs
        self.raw_num_token = raw_num_token
        self.bs = bs

    def replay(self, forward_batch: ForwardBatch) -> torch.Tensor:
        self.replay_prepare(forward_batch)
        self.graphs[self.bs].replay()
        return self.output_buffers[self.bs][: self.raw_num_token]
