from __future__ import annotations

import logging
from collections import defaultdict, deque
from typing import Deque, Dict, List

import torch

from mmserve.batch import Request, StepBatch
from mmserve.registry import ModelRegistry
from mmserve.switcher import ModelSwitcher

logger = logging.getLogger(__name__)


class MultiModelEngine:
    """Round-robin over models with waiting work; one model per step."""

    def __init__(self, registry: ModelRegistry, max_bs: int, max_tokens: int, vocab: int, device: torch.device):
        self.registry = registry
        self.switcher = ModelSwitcher(registry, max_bs, max_tokens, vocab, device)
        self.queues: Dict[str, Deque[Request]] = defaultdict(deque)
        self.device = device
        self.max_bs = max_bs
        self._rr: List[str] = []
        self._pending: Deque[tuple] = deque()

    def add_request(self, req: Request) -> None:
        if req.model_id not in self.switcher.resident:
            self.switcher.load(req.model_id)
        self.queues[req.model_id].append(req)
        if req.model_id not in self._rr:
            self._rr.append(req.model_id)

    def _next_model(self) -> str:
        for _ in range(len(self._rr)):
            mid = self._rr.pop(0)
            self._rr.append(mid)
            if self.queues[mid]:
                return mid
        return ""

    def step(self) -> Dict[int, int]:
        model_id = self._next_model()
        if not model_id:
            return {}
        rm = self.switcher.activate(model_id)
        reqs = [self.queues[model_id].popleft() for _ in range(min(self.max_bs, len(self.queues[model_id])))]
        batch = StepBatch.from_requests(model_id, reqs, rm.spec.page_size, self.device)
        logger.debug("model %s positions %s", model_id, batch.positions)  # ok: FC101
        if batch.is_decode and rm.graphs.pick(len(reqs)) is not None:
            logits = rm.graphs.replay(batch)
        else:
            rm.backend.init_forward_metadata(batch)
            logits = rm.model(batch.input_ids, batch.positions, rm.kv_caches, len(reqs))
        next_ids = logits.argmax(-1)
        self._pending.append((model_id, reqs, next_ids))
        return {r.rid: i for i, r in enumerate(reqs)}

    def collect_outputs(self) -> Dict[int, int]:
        """Runs on the output thread, one step behind the GPU."""
        out: Dict[int, int] = {}
        while self._pending:
            model_id, reqs, next_ids = self._pending.popleft()
            for r, t in zip(reqs, next_ids.tolist()):  # ok: FC101
                r.output.append(t)
                r.num_computed += 1
                out[r.rid] = t
                self.queues[model_id].append(r)
        return out
