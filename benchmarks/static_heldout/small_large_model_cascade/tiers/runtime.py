"""Everything one tier owns: KV pool, attention state, model and graph pool."""

from __future__ import annotations

import torch

from cascade.config import ModelSpec
from cascade.kvpool import TierKVPool
from tiers.attention import TierAttention
from tiers.batch import TierBatch
from tiers.graph_pool import TierGraphPool
from tiers.model import TierLM


class TierRuntime:
    def __init__(self, spec: ModelSpec, device: torch.device, decode_backend: str,
                 shared_int_workspace: torch.Tensor, max_requests: int):
        self.spec = spec
        self.device = device
        self.pool = TierKVPool(spec, device, max_requests)
        self.attn = TierAttention(spec, self.pool, device, decode_backend, shared_int_workspace)
        self.model = TierLM(spec, self.attn).to(device)
        self.graphs = TierGraphPool(self)

    def run_decode(self, batch: TierBatch) -> torch.Tensor:
        logits = self.graphs.replay(batch)
        if logits is None:
            self.attn.plan_eager_decode(batch)
            logits = self.model.decode(batch.input_ids, batch.positions, batch)
        return logits
