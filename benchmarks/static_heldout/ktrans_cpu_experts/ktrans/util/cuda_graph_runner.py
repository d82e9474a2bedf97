"""Decode CUDA graphs around the GPU part of a step (the host experts run as stream host functions)."""
from __future__ import annotations

import bisect
import contextlib
from typing import Dict

import torch

from ktrans.models.deepseek_v3 import DeepseekV3ForCausalLM
from ktrans.operators.flashinfer_mla import MLAWrapper


class DecodeGraphRunner:
    def __init__(self, model: DeepseekV3ForCausalLM, cfg, device: torch.device):
        self.model, self.device, self.max_position = model, device, cfg.max_seq_len
        self.batch_sizes = sorted(cfg.graph_batch_sizes)
        max_bs = self.batch_sizes[-1]  # captured largest first, so smaller graphs reuse its pool
        self.input_buffers: Dict[str, torch.Tensor] = {
            "input_ids": torch.zeros(max_bs, dtype=torch.long, device=device),
            "position_ids": torch.zeros(max_bs, dtype=torch.long, device=device),
        }
        self.pad_positions = torch.zeros(max_bs, dtype=torch.long, device=device)
        self.output_buffers: Dict[int, torch.Tensor] = {}
        self._graphs: Dict[int, torch.cuda.CUDAGraph] = {}

    def record(self, mla: MLAWrapper, plan_kw: dict) -> None:
        if not mla.wrapper._use_cuda_graph:  # expect: FC103
            raise RuntimeError("decode graphs need the graph-mode MLA wrapper")
        pool = None
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.inference_mode())
            stream = torch.cuda.Stream()
            stack.enter_context(torch.cuda.stream(stream))
            for bs in reversed(self.batch_sizes):
                kv_lens_host = torch.full((bs,), mla.page_size, dtype=torch.int32)
                mla.plan(bs, kv_lens_host, torch.arange(bs, dtype=torch.int32, device=self.device), **plan_kw)
                ids, pos = self.input_buffers["input_ids"][:bs], self.input_buffers["position_ids"][:bs]
                for _ in range(2):  # warm-up: JIT, cuBLAS handles, the CPU worker's first task
                    self.model.forward_decode(ids, pos)
                torch.cuda.synchronize()  # ok: FC101
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    self.output_buffers[bs] = self.model.forward_decode(ids, pos)
                pool, self._graphs[bs] = graph.pool(), graph

    def replay(self, batch_size: int, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        assert self._graphs, "record() must run before the first decode step"  # ok: FC109
        bs = self.batch_sizes[bisect.bisect_left(self.batch_sizes, batch_size)]
        if (position_ids >= self.max_position).any():  # expect: FC101
            raise ValueError("a position runs past the rope cache")
        self.input_buffers["input_ids"][:batch_size].copy_(input_ids)
        self.input_buffers["position_ids"] = torch.cat([position_ids, self.pad_positions[: bs - batch_size]])  # expect: FC107
        self._graphs[bs].replay()
        return self.output_buffers[bs][:batch_size]
