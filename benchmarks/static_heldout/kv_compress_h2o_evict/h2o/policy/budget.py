"""The KV budget of the H2O policy: a share of heavy-hitter pages plus a recent window, per request."""

from __future__ import annotations

from dataclasses import dataclass

PAGE_SIZE = 16

# FlashInfer workspaces by tier
_WS_TIERS = {"prefill": 256 << 20, "decode": 128 << 20}


@dataclass
class EvictionBudget:
    heavy_ratio: float = 0.1        # share of the budget kept for heavy hitters
    recent_ratio: float = 0.1       # share kept for the most recent pages
    max_pages: int = 256            # pages a request may hold after eviction
    min_pages: int = 8
    decay: float = 0.98             # accumulated scores fade so old heavy hitters can be replaced

    def recent_pages(self) -> int:
        return max(1, int(self.max_pages * self.recent_ratio / (self.heavy_ratio + self.recent_ratio)))


def page_bytes(num_kv_heads: int, head_dim: int, dtype_bytes: int = 2) -> int:
    assert PAGE_SIZE % 8 == 0  # ok: FC109
    return 2 * PAGE_SIZE * num_kv_heads * head_dim * dtype_bytes
