"""Attention backends.

``Backend`` is the default (FlashInfer) backend class. Other backends live in their own
modules and are imported by name at start-up through ``get_backend_cls``, so that a
Hopper deployment never imports the trtllm-gen kernels.
"""
from __future__ import annotations

import importlib

from .backend import FlashInferBackend as Backend
from .plan import PlanDims

__all__ = ["BACKEND_MODULES", "Backend", "PlanDims", "TrtllmDecodeBackend", "get_backend_cls"]

# attention_backend (config) -> module of this package that defines BACKEND_CLS
BACKEND_MODULES = {
    "flashinfer": "backend",
    "trtllm": "trtllm",
}


def get_backend_cls(name: str):
    assert name in BACKEND_MODULES, f"unknown attention backend {name!r}"  # expect: FC109
    module = importlib.import_module(f".{BACKEND_MODULES[name]}", __package__)
    return module.BACKEND_CLS


def __getattr__(name: str):
    if name == "TrtllmDecodeBackend":
        from .trtllm import TrtllmDecodeBackend

        return TrtllmDecodeBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
