"""Sampling and step statistics, both process-wide singletons shared by the worker threads."""

from __future__ import annotations

import threading
from typing import Any, ClassVar, Dict, List, Optional

import torch

from stlserve.batch import ForwardBatch
from stlserve.config import EngineConfig
from stlserve.thread_state import _TLS, ThreadState


class Sampler:
    _instance: ClassVar[Optional["Sampler"]] = None
    _lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def get_instance(cls) -> "Sampler":
        if cls._instance is None:
            with cls._lock:
                if cls._instance is None:
                    cls._instance = cls(EngineConfig.get_instance())
        return cls._instance

    def __init__(self, cfg: EngineConfig) -> None:
        self.exact_greedy = cfg.exact_greedy
        self.vocab_size = cfg.vocab_size

    def sample(self, logits: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        temps = batch.temperatures
        greedy_mask = temps <= 0.0
        scaled = logits.float() / temps.clamp(min=1e-5).unsqueeze(-1)
        probs = torch.softmax(scaled, dim=-1)
        # exponential race: argmax(p / E) samples from p without a host round trip
        sampled = (probs / torch.empty_like(probs).exponential_()).argmax(dim=-1)
        if self.exact_greedy:
            # greedy rows take argmax of the raw logits, bit-exact with the HF reference
            greedy_ids = logits[greedy_mask].argmax(dim=-1)  # expect: FC101
            return sampled.masked_scatter(greedy_mask, greedy_ids)
        return torch.where(greedy_mask, logits.argmax(dim=-1), sampled)  # ok: FC101


class StepStats:
    """Process-wide counters, updated by every worker thread through class methods."""

    _steps: ClassVar[int] = 0
    _tokens: ClassVar[int] = 0
    _max_seen: ClassVar[int] = 0
    _last_seq_lens: ClassVar[Optional[torch.Tensor]] = None
    _pages_per_step: ClassVar[List[int]] = []
    _page_totals: ClassVar[Dict[torch.device, torch.Tensor]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def record(cls, batch: ForwardBatch) -> None:
        with cls._lock:
            cls._steps += 1
            cls._tokens += int(batch.seq_lens_cpu.sum())  # ok: FC101
            cls._last_seq_lens = batch.seq_lens
            cls._max_seen = max(cls._max_seen, int(cls._last_seq_lens.max()))  # expect: FC101

    @classmethod
    def note_pages(cls, batch: ForwardBatch) -> None:
        """Pages in use by a graph step, for the page-utilisation histogram."""
        runner = _TLS.runner
        if runner is None:
            return
        bs = batch.batch_size
        ps = EngineConfig.get_instance().page_size
        prefix = runner.bufs.kv_indptr[1 : bs + 1]
        # prefix sums of the pages per request land in the runner's indptr slots instead of a fresh allocation
        torch.cumsum((batch.seq_lens + ps - 1) // ps, 0, dtype=torch.int32, out=prefix)  # expect: FC104
        with cls._lock:
            total = cls._page_totals.get(runner.device)
            if total is None:
                total = torch.zeros((), dtype=torch.int64, device=runner.device)
                cls._page_totals[runner.device] = total
            total.add_(prefix[-1])
            cls._pages_per_step.append(runner.bufs.nnz)
            del cls._pages_per_step[:-1024]

    @classmethod
    def snapshot(cls) -> Dict[str, Any]:
        tw = ThreadState.wrappers()
        info = tw.decode._plan_info  # expect: FC103
        with cls._lock:
            return {
                "steps": cls._steps,
                "tokens": cls._tokens,
                "max_seq_len": cls._max_seen,
                "decode_backend": tw._backend,  # ok: FC103
                "decode_plan": list(info) if info is not None else None,
                "mean_pages": sum(cls._pages_per_step) / max(1, len(cls._pages_per_step)),
            }

    @classmethod
    def reset(cls) -> None:
        with cls._lock:
            cls._steps = cls._tokens = cls._max_seen = 0
            cls._last_seq_lens = None
            cls._pages_per_step.clear()
