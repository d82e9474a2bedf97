from modserve.runtime.graph_runner import CudaGraphRunner
from modserve.runtime.model_runner import ModelRunner

__all__ = ["CudaGraphRunner", "ModelRunner"]
