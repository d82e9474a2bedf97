"""Records one CUDA graph per (forward mode, batch bucket) and replays it."""

from __future__ import annotations

import bisect
import dataclasses
import logging
from typing import TYPE_CHECKING, Dict, Tuple

import torch

from tabserve.batch import ForwardBatch
from tabserve.modes import Feature, ForwardMode, StaticInput

if TYPE_CHECKING:
    from tabserve.model_runner import ModelRunner

logger = logging.getLogger(__name__)

_CAPTURE_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)
_STATIC_DTYPES = {
    StaticInput.INPUT_IDS: torch.int64,
    StaticInput.POSITIONS: torch.int64,
    StaticInput.REQ_POOL_INDICES: torch.int64,
    StaticInput.SEQ_LENS: torch.int32,
    StaticInput.OUT_CACHE_LOC: torch.int64,
}
# Wrapper state shown by /debug/graphs.
_GRAPH_STATE_ATTRS = ("_use_cuda_graph", "_fixed_batch_size")


class GraphRunner:
    def __init__(self, model_runner: "ModelRunner") -> None:
        self.model_runner = model_runner
        self.backend = model_runner.attn_backend
        self.cfg = model_runner.cfg
        self.device = model_runner.device
        self.capture_bs = [b for b in _CAPTURE_BUCKETS if b <= self.cfg.max_batch_size]
        self.max_bs = self.capture_bs[-1]
        self.modes: Tuple[ForwardMode, ...] = (ForwardMode.DECODE,)
        if Feature.SPEC_VERIFY in self.cfg.features:
            self.modes += (ForwardMode.TARGET_VERIFY,)
        self.tokens_per_req = self.cfg.num_draft_tokens if ForwardMode.TARGET_VERIFY in self.modes else 1
        self.static: Dict[StaticInput, torch.Tensor] = {}
        self.seq_lens_cpu = torch.ones(self.max_bs, dtype=torch.int32, pin_memory=True)
        self.graphs: Dict[Tuple[ForwardMode, int], torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[Tuple[ForwardMode, int], torch.Tensor] = {}
        self.pool = None
        self._captured = False
        self._use_cuda_graph = self.cfg.capture_graphs

    def can_run(self, mode: ForwardMode, bs: int) -> bool:
        return self._captured and mode in self.modes and bs <= self.max_bs

    # ------------------------------------------------------------------ recording

    def record_all(self) -> None:
        assert _CAPTURE_BUCKETS == tuple(sorted(_CAPTURE_BUCKETS)), "_bucket_for bisects the buckets"  # ok: FC109
        if not self._use_cuda_graph:  # ok: FC103
            return
        n = self.max_bs * self.tokens_per_req
        if not self.static:
            self.static = {  # ok: FC107
                kind: torch.zeros(n, dtype=_STATIC_DTYPES[kind], device=self.device) for kind in StaticInput
            }
            self.static[StaticInput.SEQ_LENS].fill_(1)
        self.backend.init_cuda_graph_state(self.max_bs)
        torch.cuda.synchronize()  # ok: FC101
        for mode in self.modes:
            for bs in reversed(self.capture_bs):
                self._record_bucket(mode, bs)
        torch.cuda.synchronize()
        self._captured = True

    def _static_batch(self, mode: ForwardMode, bs: int) -> ForwardBatch:
        n_tok = bs * (self.tokens_per_req if mode is ForwardMode.TARGET_VERIFY else 1)
        st = self.static
        return ForwardBatch(
            forward_mode=mode,
            batch_size=bs,
            input_ids=st[StaticInput.INPUT_IDS][:n_tok],
            positions=st[StaticInput.POSITIONS][:n_tok],
            req_pool_indices=st[StaticInput.REQ_POOL_INDICES][:bs],
            req_pool_indices_cpu=torch.zeros(bs, dtype=torch.int64),
            seq_lens=st[StaticInput.SEQ_LENS][:bs],
            seq_lens_cpu=self.seq_lens_cpu[:bs],
            out_cache_loc=st[StaticInput.OUT_CACHE_LOC][:n_tok],
            use_graph=True,
            padded_batch_size=bs,
        )

    def _record_bucket(self, mode: ForwardMode, bs: int) -> None:
        fb = self._static_batch(mode, bs)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, fb)
        model = self.model_runner.model
        for _ in range(2):
            model(fb)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = model(fb)
        self.pool = graph.pool()
        self.graphs[(mode, bs)] = graph
        self.outputs[(mode, bs)] = out
        logger.debug("recorded %s graph for bs=%d", mode.name, bs)

    # ------------------------------------------------------------------ replay

    def _bucket_for(self, bs: int) -> int:
        assert bs <= self.max_bs, f"batch of {bs} exceeds the largest recorded bucket {self.max_bs}"  # expect: FC109
        return self.capture_bs[bisect.bisect_left(self.capture_bs, bs)]

    def replay(self, fb: ForwardBatch, replan: bool = True) -> torch.Tensor:
        assert self._captured, "record_all() has not run"  # ok: FC109
        bs = fb.batch_size
        pad = self._bucket_for(bs)
        key = (fb.forward_mode, pad)
        n_tok = fb.input_ids.numel()
        st = self.static
        st[StaticInput.INPUT_IDS][:n_tok].copy_(fb.input_ids)
        st[StaticInput.POSITIONS][:n_tok].copy_(fb.positions)
        st[StaticInput.REQ_POOL_INDICES][:bs].copy_(fb.req_pool_indices)
        st[StaticInput.SEQ_LENS][:bs].copy_(fb.seq_lens)
        st[StaticInput.SEQ_LENS][bs:pad].fill_(1)
        src = fb.out_cache_loc
        if src.numel() > st[StaticInput.OUT_CACHE_LOC].numel():
            self.static[StaticInput.OUT_CACHE_LOC] = src.clone()  # expect: FC107
        else:
            st[StaticInput.OUT_CACHE_LOC][: src.numel()].copy_(src)
        static_fb = dataclasses.replace(
            self._static_batch(fb.forward_mode, pad),
            batch_size=bs,
            padded_batch_size=pad,
            seq_lens_cpu=fb.seq_lens_cpu,
            req_pool_indices_cpu=fb.req_pool_indices_cpu,
            custom_mask=fb.custom_mask,
        )
        if replan:
            self.backend.prepare_graph_step(static_fb)
        st[StaticInput.POSITIONS][n_tok : pad * self.tokens_per_req].zero_()  # ok: FC104
        self.graphs[key].replay()
        torch.cuda.synchronize()  # expect: FC101
        return self.outputs[key][:n_tok]

    def describe(self) -> Dict[int, Dict[str, object]]:
        """Per-bucket wrapper state for the /debug/graphs endpoint."""
        summary: Dict[int, Dict[str, object]] = {}
        for bs, slot in self.backend.graph_slots.items():
            summary[bs] = {name: getattr(slot.wrapper, name) for name in _GRAPH_STATE_ATTRS}  # expect: FC103
        return summary
