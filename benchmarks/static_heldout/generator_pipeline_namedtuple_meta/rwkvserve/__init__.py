"""RWKV / attention hybrid serving with a generator step pipeline and NamedTuple metadata."""

from rwkvserve.core import (DECODE_WS_BYTES, PAGE_SIZE, PLAN_RECORD, AttnMeta, HybridConfig, Request, Scheduler, StepPlan,
                            WsTier, build_attn_meta)

__all__ = ["DECODE_WS_BYTES", "PAGE_SIZE", "PLAN_RECORD", "AttnMeta", "HybridConfig", "Request", "Scheduler", "StepPlan",
           "WsTier", "build_attn_meta"]
