"""Serving a masked-diffusion LLM: block-wise iterative denoising over a prefix KV cache."""

from dllm.config import AttnLimits, DLLMConfig

__all__ = ["AttnLimits", "DLLMConfig"]
