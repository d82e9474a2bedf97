"""Batch-invariant evaluation serving: every output must be bitwise identical
to the same request run alone."""

from bieval.config import WORKSPACE_MIB, InvariantConfig
from bieval.batch import EvalBatch, EvalRequest, EvalScheduler
from bieval.seeds import SeedBank, counter_uniform
from bieval.checker import ReplayChecker

__all__ = ["WORKSPACE_MIB", "InvariantConfig", "EvalBatch", "EvalRequest", "EvalScheduler", "SeedBank",
           "counter_uniform", "ReplayChecker"]
