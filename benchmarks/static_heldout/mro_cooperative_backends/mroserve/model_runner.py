"""Model runner (one forward per scheduler step) and the speculative-decoding worker."""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Deque, List, Optional, Tuple

import torch

from mroserve.batch import ForwardBatch
from mroserve.config import EngineConfig
from mroserve.graph_runner import CudaGraphRunner
from mroserve.model import Decoder, allocate_kv_caches
from mroserve_attn.backends import DraftGraphBackend  # also registers the concrete backends
from mroserve_attn.base import AttentionBackend

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.kv_caches = allocate_kv_caches(cfg, device)
        try:
            backend_cls = AttentionBackend.registry[cfg.attention_backend]
        except KeyError:
            known = ", ".join(sorted(AttentionBackend.registry))
            raise ValueError(f"unknown attention backend {cfg.attention_backend!r}; known: {known}") from None
        self.attn_backend = backend_cls.create(cfg, device, kv_caches=self.kv_caches)
        self.model = Decoder(cfg, self.attn_backend).to(device=device, dtype=cfg.dtype)
        self.graph_runner: Optional[CudaGraphRunner] = None
        if cfg.enable_cuda_graph and backend_cls.supports_cuda_graph:
            self.graph_runner = CudaGraphRunner(self.model, self.attn_backend, cfg, device)
            self.graph_runner.capture()
        logger.info("attention backend %s (%s)", backend_cls.name, " -> ".join(c.__name__ for c in backend_cls.__mro__[:-2]))

    @torch.inference_mode()
    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        if self.graph_runner is not None and self.graph_runner.can_run(fb):
            return self.graph_runner.replay(fb)
        self.attn_backend.init_forward_metadata(fb)
        return self.model(fb.input_ids, fb.positions, fb)


@dataclass
class SpecBatch:
    """One speculative step as the scheduler laid it out on the host.

    Pages for every draft token are reserved up front, so each draft step and the
    verify pass come with their own metadata; ``draft_extend`` re-runs the draft
    over the chunk the previous verify accepted.
    """

    draft_steps: List[ForwardBatch]
    verify: ForwardBatch
    draft_extend: Optional[ForwardBatch] = None


class AcceptanceStats:
    def __init__(self, window: int = 512) -> None:
        self.recent: Deque[int] = deque(maxlen=window)

    def record(self, accepted: List[int]) -> None:
        self.recent.extend(accepted)

    def mean(self) -> float:
        return sum(self.recent) / max(len(self.recent), 1)


class SpecWorker:
    """Draft-then-verify speculative decoding on top of a target ``ModelRunner``."""

    def __init__(self, target: ModelRunner, num_draft_layers: int = 2) -> None:
        self.target = target
        self.cfg = target.cfg.draft(num_layers=num_draft_layers)
        self.num_draft_steps = self.cfg.num_draft_steps
        device = target.device
        self.kv_caches = allocate_kv_caches(self.cfg, device)
        self.draft_backend = DraftGraphBackend.create(self.cfg, device, kv_caches=self.kv_caches)
        self.draft_model = Decoder(self.cfg, self.draft_backend).to(device=device, dtype=self.cfg.dtype)
        self.draft_graphs = CudaGraphRunner(self.draft_model, self.draft_backend, self.cfg, device)
        self.draft_graphs.capture()
        self.stats = AcceptanceStats()

    def _draft_forward(self, fb: ForwardBatch) -> torch.Tensor:
        if self.draft_graphs.can_run(fb):
            return self.draft_graphs.replay(fb)
        self.draft_backend.init_forward_metadata(fb)
        return self.draft_model(fb.input_ids, fb.positions, fb)

    @torch.inference_mode()
    def step(self, batch: SpecBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        n = batch.verify.batch_size
        k = self.num_draft_steps
        if batch.draft_extend is not None:
            self.draft_backend.init_forward_metadata(batch.draft_extend)
            self.draft_model(batch.draft_extend.input_ids, batch.draft_extend.positions, batch.draft_extend)

        drafted: List[torch.Tensor] = []
        next_ids: Optional[torch.Tensor] = None
        for i, fb in enumerate(batch.draft_steps):
            self.draft_backend.step_index = i
            if next_ids is not None:
                fb.input_ids.copy_(next_ids)
            logits = self._draft_forward(fb)
            next_ids = logits[:n].argmax(dim=-1)
            drafted.append(next_ids)
        draft = torch.stack(drafted, dim=1)

        # The target scores the last accepted token followed by the k drafts.
        batch.verify.input_ids.view(n, k + 1)[:, 1:].copy_(draft)
        target_logits = self.target.forward(batch.verify)
        target_ids = target_logits.view(n, k + 1, -1).argmax(dim=-1)
        matches = (target_ids[:, :k] == draft).to(torch.int32).cumprod(dim=1)
        accept_lens = matches.sum(dim=1)

        self.draft_backend.rollback_rejected(n, k - accept_lens)
        accepted = accept_lens.tolist()  # expect: FC101
        self.stats.record(accepted)
        return target_ids, accept_lens
