"""Gateway that colocates small models on one GPU and switches between them per step.

Each step the router picks one tenant (weighted least-served with work queued),
runs one batch of it through its own graph pool, and samples.  Tenants keep
separate CUDA-graph memory pools and FlashInfer wrappers; float workspaces are
shared per size tier.
"""
from __future__ import annotations

import logging
from typing import Dict, List, Optional

import flashcheck
import numpy as np
import torch

from colo.attn.tenant_backend import TenantAttnBackend
from colo.models.tiny_lm import TinyLM
from colo.pools import TenantGraphPool
from colo.sampler import ColoSampler
from colo.scheduler import TenantQueue
from colo.tenants import TenantKind, TenantSpec

logger = logging.getLogger(__name__)

MAX_TENANTS = 8
PAD_TOKEN = 0


class ColoRouter:
    def __init__(self, device: str = "cuda", max_vocab: int = 152064):
        self.device = torch.device(device)
        self.tenants: Dict[str, TenantSpec] = {}
        self.backends: Dict[str, TenantAttnBackend] = {}
        self.models: Dict[str, TinyLM] = {}
        self.pools: Dict[str, TenantGraphPool] = {}
        self.queues: Dict[str, TenantQueue] = {}
        self.order: List[str] = []
        self.tokens_served = torch.zeros(MAX_TENANTS, dtype=torch.float32, device=self.device)
        self.weights = torch.ones(MAX_TENANTS, dtype=torch.float32, device=self.device)
        self.queue_depth_np = np.zeros(MAX_TENANTS, dtype=np.int64)
        self.sampler = ColoSampler(self.device, max_vocab)
        self.prev_tenant: Optional[str] = None
        self.mem_budget = 0.0

    # ----------------------------------------------------------- registration
    def register_tenant(self, spec: TenantSpec, mem_fraction: float) -> None:
        assert 0.0 < mem_fraction <= 0.9, "a tenant may take at most 90% of the GPU"  # expect: FC109
        if self.mem_budget + mem_fraction > 0.95:
            raise ValueError(f"tenant {spec.name} would raise the GPU budget to {self.mem_budget + mem_fraction:.2f}")
        self.mem_budget += mem_fraction
        backend = TenantAttnBackend(spec, self.device)
        model = TinyLM(spec, backend, self.device).to(self.device)
        idx = len(self.order)
        self.tenants[spec.name] = spec
        self.backends[spec.name] = backend
        self.models[spec.name] = model
        self.pools[spec.name] = TenantGraphPool(spec, backend, model, spec.graph_buckets)
        self.queues[spec.name] = TenantQueue(spec)
        self.weights[idx] = spec.weight
        self.order.append(spec.name)
        self._check_registry()

    def _check_registry(self) -> None:
        assert set(self.order) == set(self.pools) == set(self.backends), "tenant registry out of sync"  # ok: FC109

    def share_int_workspace(self, donor: str, recipient: str) -> None:
        """Tenants never run in the same step, so two of them can share the planner's int workspace."""
        shared = self.backends[donor].decode_wrapper._int_workspace_buffer  # expect: FC103
        setattr(self.backends[recipient].decode_wrapper, "_int_workspace_buffer", shared)  # expect: FC103

    def warmup(self) -> None:
        for name in self.order:
            self.pools[name].capture_tenant()
            torch.cuda.empty_cache()

    def submit(self, tenant: str, rid: str, prompt_ids: List[int]) -> None:
        if tenant not in self.queues:
            raise KeyError(f"unknown tenant {tenant!r}")
        self.queues[tenant].submit(rid, prompt_ids)

    # ------------------------------------------------------------------- step
    def _switch_out(self, name: str) -> None:
        # scrub the outgoing tenant's page ids so a stale replay cannot touch pages it freed
        self.backends[name].kv_indices.zero_()  # expect: FC104

    @flashcheck.hot_path
    def step(self) -> Optional[torch.Tensor]:
        n = len(self.order)
        for i, name in enumerate(self.order):
            self.queue_depth_np[i] = len(self.queues[name])
        if not self.queue_depth_np[:n].any():
            return None
        busiest = int(np.argmax(self.queue_depth_np[:n]))  # ok: FC101
        served = self.tokens_served[:n] / self.weights[:n]
        tid = int(torch.argmin(served))  # expect: FC101
        if self.queue_depth_np[tid] == 0:
            tid = busiest
        name = self.order[tid]
        if self.prev_tenant is not None and self.prev_tenant != name:
            self._switch_out(self.prev_tenant)
        self.prev_tenant = name

        spec = self.tenants[name]
        batch = self.queues[name].next_batch(self.device)
        pool = self.pools[name]
        if pool.can_run(batch):
            out = pool.replay(batch)
        else:
            self.backends[name].init_forward_metadata(batch)
            out = self.models[name](batch.input_ids, batch.positions, batch.out_cache_loc)
        if spec.kind is TenantKind.GUARD:
            labels = out.argmax(dim=-1)
            self.queues[name].commit(batch, labels)
            return labels

        self.sampler.temperatures = torch.full((batch.size,), spec.temperature, dtype=torch.float32, device=self.device)  # expect: FC107
        next_ids = self.sampler.sample(out)
        done = next_ids == spec.eos_token_id
        next_ids = torch.where(done, torch.full_like(next_ids, PAD_TOKEN), next_ids)  # ok: FC101
        self.tokens_served[tid] += batch.size
        self.queues[name].commit(batch, next_ids)
        return next_ids
