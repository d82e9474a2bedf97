"""Serving engine whose attention metadata and FlashInfer arguments are typed dicts."""
from .plan_types import (GRAPH_BATCH_SIZES, PAGE_SIZE, PLAN_DEFAULTS, DecodeMeta, ForwardBatch, PlanKwargs,
                         PrefillMeta, ServeConfig, WrapperKwargs, merge_plan_kwargs, prefill_plan_kwargs,
                         wrapper_kwargs)

__all__ = ["GRAPH_BATCH_SIZES", "PAGE_SIZE", "PLAN_DEFAULTS", "DecodeMeta", "ForwardBatch", "PlanKwargs",
           "PrefillMeta", "ServeConfig", "WrapperKwargs", "merge_plan_kwargs", "prefill_plan_kwargs", "wrapper_kwargs"]
