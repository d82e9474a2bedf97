"""Per-tenant token quotas (a token bucket per tenant) and priorities."""

import time
from dataclasses import dataclass
from typing import Dict, List

import numpy as np
import torch


@dataclass
class TenantPolicy:
    name: str
    tokens_per_s: float
    burst: float
    priority: int          # larger runs first, preempts smaller
    max_running: int = 64


class TenantLedger:
    def __init__(self, max_tenants: int = 64):
        self.policies: Dict[str, TenantPolicy] = {}
        self.index: Dict[str, int] = {}
        self.tokens_used_np = np.zeros(max_tenants, dtype=np.float64)
        self.bucket_np = np.zeros(max_tenants, dtype=np.float64)
        self._last_refill = time.monotonic()

    def register(self, policy: TenantPolicy) -> int:
        assert policy.tokens_per_s > 0 and policy.burst >= policy.tokens_per_s, policy.name  # expect: FC109
        idx = self.index.setdefault(policy.name, len(self.index))
        self.policies[policy.name] = policy
        self.bucket_np[idx] = policy.burst
        return idx

    def refill(self) -> None:
        now = time.monotonic()
        dt = now - self._last_refill
        self._last_refill = now
        for name, idx in self.index.items():
            p = self.policies[name]
            self.bucket_np[idx] = min(p.burst, self.bucket_np[idx] + p.tokens_per_s * dt)

    def allowance(self, tenant: str) -> float:
        return float(self.bucket_np[self.index[tenant]])  # ok: FC101

    def charge(self, tenant: str, tokens: int) -> None:
        idx = self.index[tenant]
        self.bucket_np[idx] -= tokens
        self.tokens_used_np[idx] += tokens

    def charge_device(self, tenant_idx: torch.Tensor, tokens: torch.Tensor) -> None:
        """Charge the tokens of a step whose per-row counts live on the device."""
        per_tenant = torch.zeros(len(self.tokens_used_np), dtype=torch.float64, device=tokens.device)
        per_tenant.index_add_(0, tenant_idx, tokens.to(torch.float64))
        counts = per_tenant.cpu().numpy()  # expect: FC101
        self.tokens_used_np += counts
        self.bucket_np -= counts

    def priorities(self, tenants: List[str]) -> List[int]:
        return [self.policies[t].priority for t in tenants]
