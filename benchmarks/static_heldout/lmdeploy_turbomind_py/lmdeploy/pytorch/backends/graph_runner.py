"""CUDA graph runner: one CUDASingleGraphRunner per decode batch bucket, all sharing the input buffers
made once by CUDAGraphRunner.make_buffers; a graph is captured the first time its bucket is seen."""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Dict, List, Optional, TypeVar

import numpy as np
import torch

from lmdeploy.pytorch.backends.flashinfer_meta import FlashInferMetaBuilder, with_graph_decode
from lmdeploy.pytorch.model_inputs import StepContext, set_step_context

F = TypeVar("F", bound=Callable)


def record_function(name: str) -> Callable[[F], F]:
    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with torch.profiler.record_function(name):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return deco


class CUDASingleGraphRunner:
    def __init__(self, model, meta_builder: FlashInferMetaBuilder, input_buffers: Dict[str, torch.Tensor], batch_size: int, pool):
        self.model = model
        self.meta_builder = meta_builder
        self.input_buffers = input_buffers
        self.batch_size = batch_size
        self.pool = pool
        self._graph: Optional[torch.cuda.CUDAGraph] = None
        self.output: Optional[torch.Tensor] = None

    @record_function("fill_buffers")
    def fill_buffers(self, ctx: StepContext) -> StepContext:
        bufs = self.input_buffers
        n, bs = ctx.q_seqlens.size(0), self.batch_size
        if ctx.input_ids.size(-1) > bufs["input_ids"].size(-1):
            self.input_buffers["input_ids"] = ctx.input_ids.new_zeros((1, ctx.input_ids.size(-1)))  # expect: FC107
        self.input_buffers["input_ids"][:, :n].copy_(ctx.input_ids)
        bufs["kv_seqlens"][:n].copy_(ctx.kv_seqlens)
        kv_lens = np.ones(bs, dtype=np.int32)
        kv_lens[:n] = ctx.kv_seqlens_np
        offsets = np.zeros((bs, ctx.block_offsets_np.shape[1]), dtype=ctx.block_offsets_np.dtype)
        offsets[:n] = ctx.block_offsets_np
        flat = torch.from_numpy(self.meta_builder._flat_indices(offsets, kv_lens, self.meta_builder.block_size))
        bufs["kv_indices"][: flat.numel()].copy_(flat, non_blocking=True)  # ok: FC104
        graph_md = self.meta_builder.plan_graph(bs, kv_lens, offsets)
        # padded rows start where the last real row ends
        bufs["kv_indptr"][n + 1 : bs + 1] = bufs["kv_indptr"][n]  # expect: FC104
        return dataclasses.replace(
            ctx, input_ids=bufs["input_ids"][:, :bs], kv_seqlens=bufs["kv_seqlens"][:bs],
            attn_metadata=with_graph_decode(ctx.attn_metadata, graph_md),
        )

    @record_function("capture")
    def capture(self, ctx: StepContext) -> torch.Tensor:
        bs = self.batch_size
        self.meta_builder.make_graph_wrapper(bs, self.input_buffers)
        graph_ctx = self.fill_buffers(ctx)
        graph_ctx.max_kv_seqlen = int(self.input_buffers["kv_seqlens"][:bs].max())  # expect: FC101
        set_step_context(graph_ctx)
        self.model(graph_ctx)  # warm-up
        torch.cuda.current_stream().synchronize()  # ok: FC101
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph, pool=self.pool):
            self.output = self.model(graph_ctx)
        return self.output

    @record_function("forward")
    def forward(self, ctx: StepContext) -> torch.Tensor:
        graph_ctx = self.fill_buffers(ctx)
        set_step_context(graph_ctx)
        self._graph.replay()
        return self.output[:, : ctx.q_seqlens.size(0)]


class CUDAGraphRunner:
    """Wraps the model: decode steps up to the largest bucket replay a graph, the rest run eagerly."""

    def __init__(self, model, meta_builder: FlashInferMetaBuilder, cache_config, device: torch.device):
        self.model = model
        self.meta_builder = meta_builder
        self.device = device
        self.capture_sizes: List[int] = sorted(cache_config.graph_batch_sizes)
        self.input_buffers = self.make_buffers(self.capture_sizes[-1], cache_config.num_gpu_blocks)
        self._runner_map: Dict[int, CUDASingleGraphRunner] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.kv_layout = self.meta_builder._kv_layout  # ok: FC103

    def make_buffers(self, max_batches: int, max_blocks: int) -> Dict[str, torch.Tensor]:
        dev = self.device
        return {
            "input_ids": torch.zeros(1, max_batches, dtype=torch.int64, device=dev),
            "kv_seqlens": torch.zeros(max_batches, dtype=torch.int32, device=dev),
            "kv_indptr": torch.zeros(max_batches + 1, dtype=torch.int32, device=dev),
            "kv_indices": torch.zeros(max_blocks, dtype=torch.int32, device=dev),
            "kv_last_page_len": torch.ones(max_batches, dtype=torch.int32, device=dev),
        }

    def get_graph_key(self, input_ids: torch.Tensor, is_decoding: bool) -> int:
        assert input_ids.dim() == 2, "input_ids must be [1, num_tokens]"  # expect: FC109
        n = input_ids.size(-1)
        return next(bs for bs in self.capture_sizes if bs >= n)

    def __getattr__(self, name: str):
        # everything else (get_logits, get_input_embeddings, ...) is the model's
        return getattr(self.__dict__["model"], name)

    def __call__(self, ctx: StepContext) -> torch.Tensor:
        if not ctx.is_decoding or ctx.q_seqlens.size(0) > self.capture_sizes[-1]:
            return self.model(ctx)
        key = self.get_graph_key(ctx.input_ids, ctx.is_decoding)
        runner = self._runner_map.get(key)
        if runner is None:
            runner = CUDASingleGraphRunner(self.model, self.meta_builder, self.input_buffers, key, self.pool)
            self._runner_map[key] = runner
            return runner.capture(ctx)[:, : ctx.q_seqlens.size(0)]
        return runner.forward(ctx)
