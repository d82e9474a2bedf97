"""CUDA-graph runner of the target model: one graph per (bucket, mode).

Decode graphs are captured first, then target-verify graphs over num_draft_tokens + 1
tokens per row. Static inputs are sized for decode and grow for verify on first use.
"""
from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .decorators import phase_timer
from .forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from .engine import ModelRunner

logger = logging.getLogger(__name__)

# static inputs with one entry per token (the others have one per row)
_PER_TOKEN_INPUTS = ("input_ids", "positions", "out_cache_loc")


@dataclass
class StaticInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    req_pool_indices: torch.Tensor
    out_cache_loc: torch.Tensor
    temperatures: torch.Tensor
    top_p: torch.Tensor


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor
    hidden: torch.Tensor
    bs: int
    mode: ForwardMode


class DecodeGraphRunner:
    def __init__(self, model_runner: "ModelRunner") -> None:
        self.model_runner = model_runner
        self.attn = model_runner.attn_backend
        self.cfg = model_runner.cfg
        self.device = model_runner.device
        self.capture_sizes = sorted(self.cfg.capture_sizes)
        self.max_bs = self.capture_sizes[-1]
        self.tokens_per_req = {
            ForwardMode.DECODE: 1,
            ForwardMode.TARGET_VERIFY: self.cfg.num_draft_tokens + 1,
        }
        n, dev = self.max_bs, self.device
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.out_cache_loc = torch.zeros(n, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=dev)
        self.seq_lens_cpu = torch.ones(n, dtype=torch.int32, pin_memory=True)
        self.req_pool_indices = torch.zeros(n, dtype=torch.int64, device=dev)
        self.temperatures = torch.ones(n, dtype=torch.float32, device=dev)
        self.top_p = torch.ones(n, dtype=torch.float32, device=dev)
        self.graphs: dict[tuple[int, ForwardMode], GraphEntry] = {}
        self.pool = None
        self.stream = torch.cuda.Stream(device=dev)

    # ------------------------------------------------------------------ capture

    def _static(self) -> StaticInputs:
        return StaticInputs(
            input_ids=self.input_ids,
            positions=self.positions,
            seq_lens=self.seq_lens,
            seq_lens_cpu=self.seq_lens_cpu,
            req_pool_indices=self.req_pool_indices,
            out_cache_loc=self.out_cache_loc,
            temperatures=self.temperatures,
            top_p=self.top_p,
        )

    def _ensure_capacity(self, num_tokens: int) -> None:
        if num_tokens > self.input_ids.numel():
            for name in _PER_TOKEN_INPUTS:
                setattr(self, name, torch.zeros(num_tokens, dtype=torch.int64, device=self.device))  # expect: FC107

    @phase_timer("cuda graph capture")
    def capture(self) -> None:
        self.attn.init_cuda_graph_state(self.max_bs)
        with torch.cuda.stream(self.stream):
            for mode in (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY):
                for bs in reversed(self.capture_sizes):
                    self.capture_one_batch_size(bs, mode)
        logger.info("captured %d target graphs", len(self.graphs))

    def capture_one_batch_size(self, bs: int, mode: ForwardMode) -> None:
        tpr = self.tokens_per_req[mode]
        self._ensure_capacity(bs * tpr)
        fb = ForwardBatch.for_capture(mode, bs, tpr, self._static())
        self.attn.init_forward_metadata_capture_cuda_graph(bs, fb)
        model = self.model_runner.model
        for _ in range(2):
            model(fb)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            logger.info(f"recording {mode.name} bs={bs}, seq_lens up to {fb.seq_lens.max()}")  # expect: FC101
            logits, hidden = model(fb)
        if self.pool is None:
            self.pool = graph.pool()
        self.graphs[(bs, mode)] = GraphEntry(graph=graph, logits=logits, hidden=hidden, bs=bs, mode=mode)

    # ------------------------------------------------------------------ replay

    def bucket(self, raw_bs: int) -> int:
        return self.capture_sizes[bisect.bisect_left(self.capture_sizes, raw_bs)]

    def can_run(self, fb: ForwardBatch) -> bool:
        if fb.forward_mode not in self.tokens_per_req or fb.batch_size > self.max_bs:
            return False
        return (self.bucket(fb.batch_size), fb.forward_mode) in self.graphs

    def stage_inputs(self, bs: int, fb: ForwardBatch) -> None:
        raw_bs = fb.batch_size
        tpr = self.tokens_per_req[fb.forward_mode]
        n = raw_bs * tpr
        self._ensure_capacity(bs * tpr)
        self.input_ids[:n].copy_(fb.input_ids, non_blocking=True)
        self.positions[:n].copy_(fb.positions, non_blocking=True)
        self.out_cache_loc[:n].copy_(fb.out_cache_loc, non_blocking=True)
        # padded tokens write their KV into the reserved page 0
        self.out_cache_loc[n : bs * tpr].zero_()
        self.seq_lens[:raw_bs].copy_(fb.seq_lens, non_blocking=True)
        self.seq_lens[raw_bs:bs].fill_(1)
        self.seq_lens_cpu[:raw_bs].copy_(fb.seq_lens_cpu)
        self.req_pool_indices[:raw_bs].copy_(fb.req_pool_indices, non_blocking=True)
        self.temperatures[:raw_bs].copy_(fb.temperatures, non_blocking=True)
        self.top_p[:raw_bs].copy_(fb.top_p, non_blocking=True)

    def replay(self, fb: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.graphs, "capture() must run before replay()"  # ok: FC109
        raw_bs = fb.batch_size
        bs = self.bucket(raw_bs)
        self.stage_inputs(bs, fb)
        self.attn.init_forward_metadata_replay_cuda_graph(bs, raw_bs, fb)
        if raw_bs < bs and fb.forward_mode.is_decode():
            # padded rows read one dummy page instead of none
            pad = torch.arange(1, bs - raw_bs + 1, dtype=torch.int32, device=self.device)
            self.attn.g_kv_indptr[raw_bs + 1 : bs + 1].add_(pad)  # expect: FC104
        entry = self.graphs[(bs, fb.forward_mode)]
        entry.graph.replay()
        n = raw_bs * self.tokens_per_req[fb.forward_mode]
        # hand the sampler its own copy: the next replay overwrites the graph's output
        entry.logits = entry.logits.clone()  # expect: FC107
        return entry.logits[:n], entry.hidden[:n]
