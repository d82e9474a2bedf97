"""Logical page -> (tier, slot) mapping, kept on the host with a device mirror."""

from typing import List, Tuple

import numpy as np
import torch

from kvtier.config import TIER_CPU, TIER_GPU, TIER_NVME, TierConfig


def exclusive_cumsum(counts: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(counts.numel() + 1, dtype=torch.int32, device=counts.device)
    torch.cumsum(counts, dim=0, out=out[1:])
    return out


class TieredPageTable:
    def __init__(self, cfg: TierConfig, device):
        self.cfg = cfg
        n = cfg.num_logical_pages
        self.tier_np = np.full(n, TIER_NVME, dtype=np.int8)
        self.slot_np = np.full(n, -1, dtype=np.int64)
        self.tier_dev = torch.full((n,), TIER_NVME, dtype=torch.int8, device=device)
        self.slot_dev = torch.full((n,), -1, dtype=torch.int32, device=device)
        self.gpu_free: List[int] = list(range(cfg.num_gpu_pages - 1, -1, -1))
        self.cpu_free: List[int] = list(range(cfg.num_cpu_pages - 1, -1, -1))
        self.lru_gpu: List[int] = []

    def classify(self, page_ids_np: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        tiers = self.tier_np[page_ids_np]
        on_cpu = page_ids_np[np.flatnonzero(tiers == TIER_CPU)]  # ok: FC101
        on_nvme = page_ids_np[np.flatnonzero(tiers == TIER_NVME)]
        return on_cpu, on_nvme

    def take_gpu_slots(self, n: int) -> Tuple[np.ndarray, np.ndarray]:
        victims = []
        while len(self.gpu_free) < n and self.lru_gpu:
            victims.append(self.lru_gpu.pop(0))
            self.gpu_free.append(int(self.slot_np[victims[-1]]))
            self.tier_np[victims[-1]] = TIER_CPU
        slots = np.array([self.gpu_free.pop() for _ in range(n)], dtype=np.int64)
        return slots, np.array(victims, dtype=np.int64)

    def take_cpu_slots(self, n: int) -> np.ndarray:
        if n > len(self.cpu_free):
            raise RuntimeError(f"CPU tier full: need {n}, have {len(self.cpu_free)}")
        return np.array([self.cpu_free.pop() for _ in range(n)], dtype=np.int64)

    def mark(self, page_ids_np: np.ndarray, tier: int, slots_np: np.ndarray) -> None:
        self.tier_np[page_ids_np] = tier
        self.slot_np[page_ids_np] = slots_np
        if tier == TIER_GPU:
            self.lru_gpu.extend(int(p) for p in page_ids_np)

    def push_mirror(self, page_ids_np: np.ndarray, device) -> None:
        ids = torch.from_numpy(page_ids_np).to(device, non_blocking=True)
        self.tier_dev[ids] = torch.from_numpy(self.tier_np[page_ids_np]).to(device, non_blocking=True)
        self.slot_dev[ids] = torch.from_numpy(self.slot_np[page_ids_np].astype(np.int32)).to(device, non_blocking=True)
