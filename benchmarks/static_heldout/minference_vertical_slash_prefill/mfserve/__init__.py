"""MInference-style sparse prefill: configuration, vertical/slash estimation, block layouts."""

from .block_index import BSRLayout, build_bsr
from .config import SPARSE_WORKSPACE_BYTES, MInferenceConfig
from .patterns import VerticalSlashEstimator, VSIndex

__all__ = [
    "BSRLayout",
    "MInferenceConfig",
    "SPARSE_WORKSPACE_BYTES",
    "VSIndex",
    "VerticalSlashEstimator",
    "build_bsr",
]
