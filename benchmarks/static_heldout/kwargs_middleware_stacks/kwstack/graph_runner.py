"""CUDA graph runner for decode batches: captures the capture stack, replays with padded inputs."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Dict

import torch

from kwstack.forward_batch import ForwardBatch
from kwstack.middleware import build_capture_stack

if TYPE_CHECKING:
    from kwstack.model_runner import ModelRunner

logger = logging.getLogger(__name__)

_INPUT_DTYPES = {
    "input_ids": torch.int64,
    "req_pool_indices": torch.int64,
    "seq_lens": torch.int32,
    "out_cache_loc": torch.int64,
    "positions": torch.int64,
}


def _pages_needed(lens, page_size: int) -> int:
    """Pages a batch touches; called with host lengths only."""
    return int(((lens + page_size - 1) // page_size).sum())  # ok: FC101


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner"):
        self.model_runner = model_runner
        self.backend = model_runner.attn_backend
        sa = model_runner.server_args
        self.device = model_runner.device
        self.page_size = sa.page_size
        self.capture_bs = sorted(sa.cuda_graph_bs)
        self.max_bs = self.capture_bs[-1]
        self.input_buffers: Dict[str, torch.Tensor] = {
            name: torch.zeros(self.max_bs, dtype=dtype, device=self.device) for name, dtype in _INPUT_DTYPES.items()
        }
        self.input_buffers["seq_lens_cpu"] = torch.ones(self.max_bs, dtype=torch.int32)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.static_logits: Dict[int, torch.Tensor] = {}
        self.pool = None
        self.capture_stack = build_capture_stack(model_runner._forward_core, tag="decode-capture")
        self.backend.init_cuda_graph_state(self.max_bs, self.capture_bs)
        self.capture()

    def can_run(self, fb: ForwardBatch) -> bool:
        return fb.forward_mode.is_decode() and fb.batch_size <= self.max_bs

    # ------------------------------------------------------------------ capture
    def capture(self) -> None:
        for bs in reversed(self.capture_bs):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        fb = ForwardBatch.for_capture(bs, self.input_buffers)
        pages = _pages_needed(fb.seq_lens_cpu, self.page_size)
        logger.debug("capture bs=%d pages=%d", bs, pages)
        self.backend.init_forward_metadata_capture_cuda_graph(
            bs, fb.req_pool_indices, fb.seq_lens, fb.seq_lens_cpu, fb
        )
        for _ in range(2):
            self.capture_stack(fb)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logger.info(f"capturing bs={bs} longest={fb.seq_lens.max()}")  # expect: FC101
            out = self.capture_stack(fb, capturing=True)
        if self.pool is None:
            self.pool = graph.pool()
        self.graphs[bs] = graph
        self.outputs[bs] = out
        self.static_logits[bs] = torch.empty_like(out)  # ok: FC107

    # ------------------------------------------------------------------ replay
    def _stage(self, raw_bs: int, bs: int, **inputs: torch.Tensor) -> None:
        """Copy each named input into its static buffer; padded batches take the tail from the buffer."""
        for name, value in inputs.items():
            buf = self.input_buffers[name]
            if value.shape[0] > buf.shape[0]:
                raise ValueError(f"{name}: {value.shape[0]} rows > static buffer {buf.shape[0]}")
            if raw_bs < bs:
                self.input_buffers[name] = torch.cat([value, buf[raw_bs:]])  # expect: FC107
            else:
                buf[:raw_bs].copy_(value, non_blocking=True)

    def replay_prepare(self, fb: ForwardBatch, **kwargs) -> int:
        raw_bs = fb.batch_size
        bs = next(b for b in self.capture_bs if b >= raw_bs)
        self._stage(
            raw_bs,
            bs,
            input_ids=fb.input_ids,
            req_pool_indices=fb.req_pool_indices,
            seq_lens=fb.seq_lens,
            out_cache_loc=fb.out_cache_loc,
            positions=fb.positions,
        )
        self.input_buffers["seq_lens_cpu"][:raw_bs].copy_(fb.seq_lens_cpu)
        self.input_buffers["seq_lens_cpu"][raw_bs:bs].fill_(1)
        if _pages_needed(fb.seq_lens_cpu, self.page_size) > self.backend.kv_indices.numel():
            raise RuntimeError("kv_indices too small for this batch; raise max_total_tokens")
        self.backend.init_forward_metadata_replay_cuda_graph(
            bs,
            raw_bs,
            self.input_buffers["req_pool_indices"],
            self.input_buffers["seq_lens"],
            self.input_buffers["seq_lens_cpu"],
            **kwargs,
        )
        return bs

    def replay(self, fb: ForwardBatch, **kwargs) -> torch.Tensor:
        bs = self.replay_prepare(fb, **kwargs)
        self.graphs[bs].replay()
        return self.outputs[bs][: fb.batch_size]
