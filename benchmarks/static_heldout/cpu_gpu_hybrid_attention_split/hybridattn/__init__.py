"""Hybrid CPU/GPU decode attention: planning the split, host kernels, LSE merge."""

from .batch import HybridBatch
from .config import HybridConfig
from .cpu_kernels import attend_far, attend_far_chunked
from .merge import merge_partials
from .split import SplitPlan, SplitPlanner, cpu_token_counts, window_last_page_len

__all__ = [
    "HybridBatch",
    "HybridConfig",
    "SplitPlan",
    "SplitPlanner",
    "attend_far",
    "attend_far_chunked",
    "cpu_token_counts",
    "merge_partials",
    "window_last_page_len",
]
