"""Model runner: owns the model, the attention backend, the sampler and the graph runner,
and runs one scheduler step per ``step()`` call."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

import lazyserve.layers.sampler as sampler_mod
from lazyserve import Sampler  # resolved by lazyserve.__getattr__ (PEP 562)

from ..batch import ForwardBatch, HostStaging, ScheduledBatch
from ..config import EngineConfig
from ..layers.attention import Backend, get_backend_cls
from ..layers.model import DecoderModel
from ..utils import configure_extend_workspace

logger = logging.getLogger(__name__)


@dataclass
class StepStats:
    graph_steps: int = 0
    eager_steps: int = 0
    padded_rows: int = 0
    kv_tokens: int = 0


def record_graph_stats(stats: StepStats, fb: ForwardBatch, bs: int) -> None:
    stats.graph_steps += 1
    stats.padded_rows += bs - fb.batch_size
    stats.kv_tokens += sum(fb.seq_lens.tolist())  # expect: FC101


def record_eager_stats(stats: StepStats, fb: ForwardBatch) -> None:
    stats.eager_steps += 1
    stats.kv_tokens += int(fb.seq_lens_cpu.sum())  # ok: FC101


@dataclass
class StepOutput:
    next_token_ids: torch.Tensor  # pinned; valid once `ready` has completed
    ready: torch.cuda.Event


class ModelRunner:
    def __init__(self, cfg: EngineConfig, device: str = "cuda") -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        configure_extend_workspace(cfg)  # before any backend sizes its extend workspace
        backend_cls = get_backend_cls(cfg.attention_backend)
        self.attn_backend = backend_cls(cfg, self.device)
        self.model = DecoderModel(cfg, self.attn_backend).to(device=self.device, dtype=torch.bfloat16)
        self.sampler = Sampler(cfg, self.device)
        self.staging = HostStaging(cfg, self.device)
        self.stop_token_ids = torch.tensor(cfg.stop_token_ids, dtype=torch.int64, device=self.device)
        self.stats = StepStats()
        self.output_pinned = torch.empty(cfg.max_batch_size, dtype=torch.int64, pin_memory=True)
        self.scrub_staging = torch.empty(cfg.num_pages, dtype=torch.int32, pin_memory=True)
        self.copy_event = torch.cuda.Event()
        if isinstance(self.attn_backend, Backend):
            q = torch.zeros(1, cfg.num_qo_heads, cfg.head_dim, dtype=torch.bfloat16, device=self.device)
            self.attn_backend.warmup_eager(q)
        self.graph_runner = None
        if not cfg.disable_cuda_graph:
            self.init_cuda_graphs()

    def init_cuda_graphs(self) -> None:
        # graph.py imports this module; take the class from the package's lazy exports
        from lazyserve.runtime import GraphRunner

        self.graph_runner = GraphRunner(self)

    def describe(self) -> dict:
        return {
            "backend": type(self.attn_backend).__name__,
            "kv_layout": self.attn_backend._kv_layout,  # ok: FC103
            "graphs": [] if self.graph_runner is None else sorted(self.graph_runner.graphs),
        }

    def prepare_batch(self, sched: ScheduledBatch) -> ForwardBatch:
        return self.staging.build(sched, self.stop_token_ids)

    def step(self, sched: ScheduledBatch) -> StepOutput:
        fb = self.prepare_batch(sched)
        if sched.freed_pages is not None and sched.freed_pages.size:
            self._scrub_pages(sched.freed_pages)

        if fb.forward_mode.is_decode() and self.graph_runner is not None and self.graph_runner.can_run(fb):
            logits = self.graph_runner.replay(fb)
        else:
            self.attn_backend.init_forward_metadata(fb)
            logits = self.model(fb.input_ids, fb.positions, fb)
            record_eager_stats(self.stats, fb)

        sampler_mod.suppress_eos(logits, fb, self.cfg.eos_token_id)
        next_ids = self.sampler.sample(logits, fb)
        return self._publish(next_ids, fb.batch_size)

    def _publish(self, next_ids: torch.Tensor, bs: int) -> StepOutput:
        if bs > self.output_pinned.numel():
            self.output_pinned = torch.empty(bs, dtype=torch.int64, pin_memory=True)  # ok: FC107
        out = self.output_pinned[:bs]
        out.copy_(next_ids, non_blocking=True)  # ok: FC101
        self.copy_event.record()
        return StepOutput(out, self.copy_event)

    def _scrub_pages(self, pages_np: np.ndarray) -> None:
        """Reset the fp8 per-page KV scales of the pages freed since the previous step."""
        if not isinstance(self.attn_backend, Backend):
            return
        if self.attn_backend.cuda_graph_kv_indices is None:
            return
        n = pages_np.shape[0]
        self.scrub_staging[:n] = torch.from_numpy(pages_np)
        # borrow the graph index buffer as scratch: its pages are rewritten before every replay
        idx = self.attn_backend.cuda_graph_kv_indices[:n]
        idx.copy_(self.scrub_staging[:n], non_blocking=True)  # expect: FC104
        self.attn_backend.k_scale.index_fill_(0, idx.long(), 1.0)
        self.attn_backend.v_scale.index_fill_(0, idx.long(), 1.0)
