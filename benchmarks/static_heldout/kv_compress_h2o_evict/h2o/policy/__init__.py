from h2o.policy.budget import PAGE_SIZE, EvictionBudget, page_bytes
from h2o.policy.tracker import HeavyHitterTracker

__all__ = ["PAGE_SIZE", "EvictionBudget", "HeavyHitterTracker", "page_bytes"]
