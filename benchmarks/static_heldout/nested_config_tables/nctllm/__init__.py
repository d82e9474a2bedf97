"""nctllm: a small TensorRT-LLM / rtp-llm shaped engine configured by nested tables."""

from nctllm.engine import PyTorchModelEngine

__all__ = ["PyTorchModelEngine"]
