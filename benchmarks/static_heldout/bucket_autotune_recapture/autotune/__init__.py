"""Traffic-driven CUDA-graph bucket selection and re-capture."""

from autotune.config import AutotuneConfig, WorkspaceTier

__all__ = ["AutotuneConfig", "WorkspaceTier"]
