"""Keeps at most `max_resident` models on the GPU and makes one of them active per step."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from mmserve.attn.backend import PerModelAttnBackend
from mmserve.graph_pool import ModelGraphPool
from mmserve.model import ResidentDecoder
from mmserve.registry import ModelRegistry, ModelSpec

logger = logging.getLogger(__name__)


@dataclass
class ResidentModel:
    model_id: str
    spec: ModelSpec
    model: ResidentDecoder
    backend: PerModelAttnBackend
    graphs: ModelGraphPool
    kv_caches: List[torch.Tensor]
    last_used: float = field(default_factory=time.monotonic)


class ModelSwitcher:
    def __init__(self, registry: ModelRegistry, max_bs: int, max_tokens: int, vocab: int,
                 device: torch.device):
        self.registry = registry
        self.max_bs = max_bs
        self.max_tokens = max_tokens
        self.vocab = vocab
        self.device = device
        self.resident: Dict[str, ResidentModel] = {}
        self.active: Optional[ResidentModel] = None
        self.num_switches = 0

    def load(self, model_id: str) -> ResidentModel:
        spec = self.registry.spec(model_id)
        if len(self.resident) >= self.registry.max_resident:
            self._evict_lru()
        backend = PerModelAttnBackend(spec, self.max_bs, self.max_tokens, self.device)
        model = ResidentDecoder(spec, backend, self.vocab).to(self.device, dtype=torch.bfloat16)
        model.load_state_dict(torch.load(self.registry.weights_path(model_id), map_location=self.device))
        n_pages = self.max_bs * spec.max_pages_per_req
        kv_caches = [
            torch.zeros(n_pages, 2, spec.page_size, spec.num_kv_heads, spec.head_dim,
                        dtype=torch.bfloat16, device=self.device)
            for _ in range(spec.num_layers)
        ]
        graphs = ModelGraphPool(model_id, model, backend, kv_caches, spec.graph_batch_sizes, self.device)
        graphs.record_all()
        rm = ResidentModel(model_id, spec, model, backend, graphs, kv_caches)
        self.resident[model_id] = rm
        return rm

    def activate(self, model_id: str) -> ResidentModel:
        assert model_id in self.resident, f"{model_id} not loaded"  # expect: FC109
        incoming = self.resident[model_id]
        if self.active is not None and self.active.model_id != model_id:
            outgoing: ResidentModel = self.active
            torch.cuda.current_stream().synchronize()  # expect: FC101
            # make sure no stale graph of the outgoing model can read the incoming model's pages
            outgoing.backend.kv_indices.zero_()  # expect: FC104
            backend = outgoing.backend
            if getattr(backend.eager_decode, "_cached_module", None) is None:  # expect: FC103
                logger.info("%s decode kernels not compiled yet", outgoing.model_id)
            self.num_switches += 1
        incoming.last_used = time.monotonic()
        self.active = incoming
        return incoming

    def _evict_lru(self) -> None:
        victim = min(self.resident.values(), key=lambda r: r.last_used)
        if self.active is not None and victim.model_id == self.active.model_id:
            raise RuntimeError("cannot evict the active model")
        victim.graphs.release()
        del self.resident[victim.model_id]
        torch.cuda.empty_cache()
