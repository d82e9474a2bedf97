"""Data-parallel attention with expert-parallel MoE: configuration and cross-rank padding."""
from .config import EAGER_WS_TIERS, DPConfig
from .gather import MoEPadPlan, gather_token_counts, gather_token_counts_cpu

__all__ = ["DPConfig", "EAGER_WS_TIERS", "MoEPadPlan", "gather_token_counts", "gather_token_counts_cpu"]
