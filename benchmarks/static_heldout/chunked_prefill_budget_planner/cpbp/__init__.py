"""Chunked-prefill scheduler: one mixed batch per step under a token budget."""

from cpbp.config import GRAPH_BATCH_SIZES, MIXED_PREFILL_WS_BYTES, PAGE_SIZE, SchedulerConfig
from cpbp.budget import PageAllocator, Request, ScheduledRow, StepPlan, TokenBudgetScheduler

__all__ = ["GRAPH_BATCH_SIZES", "MIXED_PREFILL_WS_BYTES", "PAGE_SIZE", "PageAllocator", "Request",
           "ScheduledRow", "SchedulerConfig", "StepPlan", "TokenBudgetScheduler"]
