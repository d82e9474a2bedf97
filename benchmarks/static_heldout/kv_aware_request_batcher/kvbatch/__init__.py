"""Decode batches formed by KV footprint: page budgets, graph buckets, a cost model."""

from kvbatch.config import CACHED_MODULE_ATTR, BatcherConfig, knobs
from kvbatch.cost import CostModel, LinearCostModel

__all__ = ["CACHED_MODULE_ATTR", "BatcherConfig", "knobs", "CostModel", "LinearCostModel"]
