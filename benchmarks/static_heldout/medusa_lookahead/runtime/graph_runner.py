"""CUDA graphs of the lookahead verify step (verify attention, branch refresh, Medusa heads), per batch size."""

from __future__ import annotations

import functools
from typing import Callable, Dict, List, Tuple

import torch

from lookahead import LookaheadAttnBackend, MedusaHeads, SpecLimits, lim


def _nvtx(name: str) -> Callable:
    def deco(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            torch.cuda.nvtx.range_push(name)
            try:
                return fn(*args, **kwargs)
            finally:
                torch.cuda.nvtx.range_pop()

        return wrapper

    return deco


class SpecGraphRunner:
    def __init__(self, model, backend: LookaheadAttnBackend, medusa: MedusaHeads, kv_caches: List[torch.Tensor],
                 limits: SpecLimits, use_cuda_graph: bool = True):
        self.model = model
        self.backend = backend
        self.medusa = medusa
        self.kv_caches = kv_caches
        self.limits = limits
        self._use_cuda_graph = use_cuda_graph  # ok: FC103
        max_bs = limits.graph_batch_sizes[-1]
        self.static_ids = torch.zeros(max_bs * lim.NUM_VERIFY_TOKENS, dtype=torch.int64, device=backend.device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}
        self._pool = None

    def warmup_jit(self) -> None:
        """Build the JIT kernels of the branch attention before capture, so none compiles inside a graph."""
        if self.backend.branch.wrapper._cached_module is None:  # expect: FC103
            self.backend.branch.plan(1)

    def capture(self) -> None:
        if not self._use_cuda_graph:
            return
        self.warmup_jit()
        for i, bs in enumerate(self.limits.graph_batch_sizes):
            self._capture_one(bs, warmups=3 if i == 0 else 1)

    def _capture_one(self, bs: int, warmups: int) -> None:
        q = lim.NUM_VERIFY_TOKENS
        if self.medusa.max_depth >= q:
            raise ValueError("the Medusa tree is deeper than the verify window")
        seq_lens_cpu = torch.full((bs,), self.limits.page_size + q, dtype=torch.int32)
        req_pool_indices = torch.arange(bs, device=self.backend.device)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, req_pool_indices, seq_lens_cpu)
        self.backend.branch.plan(bs)
        for _ in range(warmups):
            self._run_verify(bs, use_graph=True)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            self.outputs[bs] = self._run_verify(bs, use_graph=True)
        self._pool = graph.pool()
        self.graphs[bs] = graph

    def _run_verify(self, bs: int, use_graph: bool) -> Tuple[torch.Tensor, torch.Tensor]:
        q, win = lim.NUM_VERIFY_TOKENS, lim.LOOKAHEAD_WINDOW
        hidden = self.model.embed(self.static_ids[: bs * q])
        for kv in self.kv_caches:
            attn = self.backend.forward_verify(self.model.project_q(hidden), kv, bs, use_graph)
            hidden = hidden + self.model.project_o(attn)
        window = self.model.project_q(hidden).view(bs, q, *attn.shape[1:])[:, :win].flatten(0, 1)
        refreshed = self.backend.branch(window, window, window)
        logits = self.model.lm_head(hidden)
        depth = int(self.medusa.tree_depths.max())  # expect: FC101
        drafts = self.medusa(self.model.project_o(refreshed).view(bs, win, -1)[:, -1])[:, :depth]
        return logits, drafts

    @_nvtx("lookahead.replay")
    def replay(self, batch) -> Tuple[torch.Tensor, torch.Tensor]:
        bs = batch.batch_size
        n = batch.input_ids.numel()
        self.static_ids[:n].copy_(batch.input_ids, non_blocking=True)
        self.backend.init_forward_metadata_replay_cuda_graph(
            bs, batch.req_pool_indices, batch.seq_lens, batch.seq_lens_cpu, batch.parents_cpu
        )
        self.backend.branch.plan(bs)
        self.graphs[bs].replay()
        logits, drafts = self.outputs[bs]
        return logits[:n], drafts
