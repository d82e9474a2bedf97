"""Pipeline-parallel serving: configuration, microbatching and stage-to-stage transfer."""
from ppserve.config import PAGE_SIZE, PREFILL_WS_MB, PipelineConfig, StageSpec
from ppserve.microbatch import Microbatch, Request, ScheduledBatch, split_batch

__all__ = [
    "PAGE_SIZE",
    "PREFILL_WS_MB",
    "PipelineConfig",
    "StageSpec",
    "Microbatch",
    "Request",
    "ScheduledBatch",
    "split_batch",
]
