"""Tiered KV storage: GPU pages, pinned CPU pages and NVMe-backed pages."""

from kvtier.config import TIER_CPU, TIER_GPU, TIER_NVME, TierConfig

__all__ = ["TierConfig", "TIER_GPU", "TIER_CPU", "TIER_NVME"]
