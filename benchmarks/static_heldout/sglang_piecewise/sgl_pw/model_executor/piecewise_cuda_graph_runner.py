"""Piecewise CUDA graphs for extend batches: the compiled model is captured per token count, attention runs
eagerly between the pieces (it is a splitting op)."""

from __future__ import annotations

import bisect
import gc
import logging
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from sgl_pw.compilation.compilation_config import CompilationConfig
from sgl_pw.compilation.compile import install_torch_compiled, set_compiled
from sgl_pw.forward_context import set_forward_context
from sgl_pw.model_executor.forward_batch_info import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from sgl_pw.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)


@contextmanager
def freeze_gc(enable: bool = True):
    gc.collect()
    if enable:
        gc.freeze()
    try:
        yield
    finally:
        if enable:
            gc.unfreeze()


class PiecewiseCudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner"):
        self.model_runner = model_runner
        self.device = model_runner.device
        self.compile_config = CompilationConfig(capture_sizes=list(model_runner.server_args.piecewise_cuda_graph_tokens))
        self.capture_num_tokens = sorted(self.compile_config.capture_sizes)
        self.max_num_tokens = self.capture_num_tokens[-1]
        self.max_bs = model_runner.server_args.piecewise_cuda_graph_max_bs
        self.attention_layers = [layer.attn for layer in model_runner.model.layers]
        with torch.device(self.device):
            self.input_ids = torch.zeros((self.max_num_tokens,), dtype=torch.int64)
            self.positions = torch.zeros((self.max_num_tokens,), dtype=torch.int64)
            self.out_cache_loc = torch.zeros((self.max_num_tokens,), dtype=torch.int64)
            self.req_pool_indices = torch.zeros((self.max_bs,), dtype=torch.int64)
            self.seq_lens = torch.ones((self.max_bs,), dtype=torch.int32)
            self.extend_seq_lens = torch.zeros((self.max_bs,), dtype=torch.int32)
            self.extend_prefix_lens = torch.zeros((self.max_bs,), dtype=torch.int32)
        self.static_custom_mask = None
        self.last_extend_lens_cpu = None
        install_torch_compiled(model_runner.model, compile_config=self.compile_config, graph_pool=model_runner.graph_pool)
        with set_compiled(True):
            self.warmup_and_capture()

    def can_run(self, forward_batch: ForwardBatch) -> bool:
        num_tokens = len(forward_batch.input_ids)
        return (
            forward_batch.forward_mode.is_extend()
            and num_tokens <= self.max_num_tokens
            and forward_batch.batch_size <= self.max_bs
        )

    def warmup_and_capture(self):
        with freeze_gc():
            for num_tokens in reversed(self.capture_num_tokens):
                self.capture_one_batch_size(num_tokens)
        torch.cuda.synchronize()  # ok: FC101

    def capture_one_batch_size(self, num_tokens: int):
        bs = 1
        self.seq_lens[:bs].fill_(num_tokens)
        self.extend_seq_lens[:bs].fill_(num_tokens)
        forward_batch = ForwardBatch(
            forward_mode=ForwardMode.EXTEND,
            batch_size=bs,
            input_ids=self.input_ids[:num_tokens],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            out_cache_loc=self.out_cache_loc[:num_tokens],
            seq_lens_sum=num_tokens,
            positions=self.positions[:num_tokens],
            seq_lens_cpu=torch.tensor([num_tokens], dtype=torch.int32),
            extend_seq_lens=self.extend_seq_lens[:bs],
            extend_prefix_lens=self.extend_prefix_lens[:bs],
            extend_seq_lens_cpu=[num_tokens],
            extend_prefix_lens_cpu=[0],
            extend_num_tokens=num_tokens,
            req_to_token_pool=self.model_runner.req_to_token_pool,
            token_to_kv_pool=self.model_runner.token_to_kv_pool,
            attn_backend=self.model_runner.attn_backend,
        )
        logger.info(f"Capturing piecewise graphs: num_tokens={num_tokens}, seq_lens={forward_batch.seq_lens}")  # expect: FC101
        self.model_runner.attn_backend.init_forward_metadata(forward_batch)
        for _ in range(self.compile_config.cudagraph_num_of_warmups + 1):
            with set_forward_context(forward_batch, self.attention_layers):
                self.model_runner.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)

    def replay_prepare(self, forward_batch: ForwardBatch) -> ForwardBatch:
        num_tokens = len(forward_batch.input_ids)
        static_num_tokens = self.capture_num_tokens[bisect.bisect_left(self.capture_num_tokens, num_tokens)]
        bs = forward_batch.batch_size
        if bs > self.req_pool_indices.shape[0]:
            self.req_pool_indices = torch.zeros((bs,), dtype=torch.int64, device=self.device)  # expect: FC107
        self.input_ids[:num_tokens].copy_(forward_batch.input_ids)
        self.positions[:num_tokens].copy_(forward_batch.positions)
        self.out_cache_loc[:num_tokens].copy_(forward_batch.out_cache_loc)
        if static_num_tokens > num_tokens:
            last_pos = int(forward_batch.positions[num_tokens - 1])  # expect: FC101
            self.positions[num_tokens:static_num_tokens].fill_(last_pos)
            self.out_cache_loc[num_tokens:static_num_tokens].zero_()
        self.req_pool_indices[:bs].copy_(forward_batch.req_pool_indices)
        self.seq_lens[:bs].copy_(forward_batch.seq_lens)
        self.extend_seq_lens[:bs].copy_(forward_batch.extend_seq_lens)
        self.extend_prefix_lens[:bs].copy_(forward_batch.extend_prefix_lens)
        max_extend_len = max(forward_batch.extend_seq_lens_cpu)  # ok: FC101
        if self.model_runner.server_args.enable_custom_mask and max_extend_len > 1:
            if self.static_custom_mask is None:
                self.static_custom_mask = torch.zeros(  # ok: FC107
                    (self.max_num_tokens * self.max_num_tokens,), dtype=torch.uint8, device=self.device
                )
        self.last_extend_lens_cpu = torch.tensor(forward_batch.extend_seq_lens_cpu, dtype=torch.int32)  # ok: FC107
        return ForwardBatch(
            forward_mode=forward_batch.forward_mode,
            batch_size=bs,
            input_ids=self.input_ids[:static_num_tokens],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            out_cache_loc=self.out_cache_loc[:static_num_tokens],
            seq_lens_sum=forward_batch.seq_lens_sum,
            positions=self.positions[:static_num_tokens],
            seq_lens_cpu=forward_batch.seq_lens_cpu,
            extend_seq_lens=self.extend_seq_lens[:bs],
            extend_prefix_lens=self.extend_prefix_lens[:bs],
            extend_seq_lens_cpu=forward_batch.extend_seq_lens_cpu,
            extend_prefix_lens_cpu=forward_batch.extend_prefix_lens_cpu,
            extend_num_tokens=forward_batch.extend_num_tokens,
            req_to_token_pool=forward_batch.req_to_token_pool,
            token_to_kv_pool=forward_batch.token_to_kv_pool,
            attn_backend=forward_batch.attn_backend,
        )

    def replay(self, forward_batch: ForwardBatch, **kwargs) -> torch.Tensor:
        static_forward_batch = self.replay_prepare(forward_batch)
        self.model_runner.attn_backend.init_forward_metadata(forward_batch)
        with set_compiled(True), set_forward_context(static_forward_batch, self.attention_layers):
            output = self.model_runner.model.forward(
                static_forward_batch.input_ids, static_forward_batch.positions, static_forward_batch
            )
        num_tokens = len(forward_batch.input_ids)
        logger.debug("piecewise replay: %d tokens, seq_lens=%s", num_tokens, forward_batch.seq_lens)  # ok: FC101
        return output[:num_tokens]
