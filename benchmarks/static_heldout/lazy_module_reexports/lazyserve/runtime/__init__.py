"""Runtime: the model runner and the CUDA-graph runner.

Both are imported on first use: ``graph`` reaches back into ``model_runner`` for its
step statistics and ``model_runner`` builds the graph runner, so neither may be imported
here at package import time.
"""
from __future__ import annotations

__all__ = ["ModelRunner", "CudaGraphRunner", "GraphRunner"]


def __getattr__(name: str):
    if name == "ModelRunner":
        from .model_runner import ModelRunner

        return ModelRunner
    if name in ("GraphRunner", "CudaGraphRunner"):
        from .graph import CudaGraphRunner

        return CudaGraphRunner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
