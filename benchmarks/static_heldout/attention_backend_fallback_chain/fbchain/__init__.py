"""Attention backend selection: trtllm-gen -> FlashInfer FA2 -> a Triton/torch fallback.

The chain is ordered at start-up by what the device supports (SM version, dtype, head
dim) and consulted again every step (sequence lengths, decode or prefill); each backend
builds its FlashInfer wrappers lazily, the first time a step needs them.
"""
from fbchain.capability import DeviceCaps, detect_caps
from fbchain.config import ChainConfig
from fbchain.registry import BACKEND_REGISTRY, register_backend
from fbchain.selector import BackendChain

__all__ = ["DeviceCaps", "detect_caps", "ChainConfig", "BACKEND_REGISTRY", "register_backend", "BackendChain"]
