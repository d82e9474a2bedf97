"""Shared pieces of the union-typed backend engine: constants, config and the per-step batch."""
from .batch import StepBatch, build_step_batch
from .config import ModelConfig, workspace_bytes_for
from .constants import DEFAULT_BUCKETS, HEAD_DIM, PAGE_SIZE, TRTLLM_WS_BYTES

__all__ = [
    "DEFAULT_BUCKETS",
    "HEAD_DIM",
    "PAGE_SIZE",
    "TRTLLM_WS_BYTES",
    "ModelConfig",
    "StepBatch",
    "build_step_batch",
    "workspace_bytes_for",
]
