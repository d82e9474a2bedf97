"""FlashInfer attention for opserve."""

from opserve.attention.backend import FlashInferPipelineBackend

__all__ = ["FlashInferPipelineBackend"]
