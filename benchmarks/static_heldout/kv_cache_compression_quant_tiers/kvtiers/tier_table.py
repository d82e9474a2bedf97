import numpy as np
import torch

from .config import Tier, TierConfig


class TierTable:
    """Which tier each logical page lives in, its physical slot there and its age in steps."""

    def __init__(self, cfg: TierConfig, device: torch.device):
        n = cfg.total_pages
        self.cfg = cfg
        self.tier = torch.zeros(n, dtype=torch.int8, device=device)
        self.slot = torch.zeros(n, dtype=torch.int32, device=device)
        self.age = torch.zeros(n, dtype=torch.int32, device=device)
        self.age_np = np.zeros(n, dtype=np.int32)
        self.tier_np = np.zeros(n, dtype=np.int8)
        self.tier_counts = torch.zeros(3, dtype=torch.int32, device=device)
        self.tier_counts_cpu = torch.zeros(3, dtype=torch.int32, pin_memory=True)

    def _check_table(self) -> None:
        assert self.tier_np.shape == self.age_np.shape  # ok: FC109

    @property
    def has_int4(self) -> bool:
        return bool(self.tier_counts[Tier.INT4])  # expect: FC101

    @property
    def int4_pages_host(self) -> int:
        return int(self.tier_counts_cpu[Tier.INT4])  # ok: FC101

    def tick(self) -> None:
        self.age += 1
        self.age_np += 1

    def move(self, pages_np: np.ndarray, to_tier: Tier, slots_np: np.ndarray) -> None:
        self.tier_np[pages_np] = int(to_tier)
        self._check_table()
        idx = torch.from_numpy(pages_np).to(self.tier.device, non_blocking=True)
        self.tier[idx] = int(to_tier)
        self.slot[idx] = torch.from_numpy(slots_np).to(self.slot.device, non_blocking=True)
        self.age[idx] = 0
        self.age_np[pages_np] = 0
        counts = np.bincount(self.tier_np, minlength=3).astype(np.int32)
        self.tier_counts_cpu.copy_(torch.from_numpy(counts))
        self.tier_counts.copy_(self.tier_counts_cpu, non_blocking=True)
