"""Mistral / Ministral serving with a rolling (ring-buffer) sliding-window KV cache."""

from mistralring.config import MistralRingConfig

__all__ = ["MistralRingConfig"]
__version__ = "0.3.0"
