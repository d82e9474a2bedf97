"""lazyserve: a small serving engine around FlashInfer attention and CUDA graphs.

``import lazyserve`` only loads the configuration. The runtime, the model and the
sampler pull in torch and flashinfer; they are imported on first attribute access
(PEP 562), so ``lazyserve.EngineConfig`` stays cheap for the CLI and the scheduler
process.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .config import EngineConfig

__version__ = "0.3.0"

_RUNTIME_NAMES = ("ModelRunner", "CudaGraphRunner", "GraphRunner")

__all__ = ["CudaGraphRunner", "EngineConfig", "ForwardBatch", "GraphRunner", "ModelRunner", "Sampler"]

if TYPE_CHECKING:  # pragma: no cover
    from .batch import ForwardBatch
    from .layers.sampler import Sampler
    from .runtime.graph import CudaGraphRunner
    from .runtime.model_runner import ModelRunner

    GraphRunner = CudaGraphRunner


def __getattr__(name: str):
    if name == "Sampler":
        from .layers.sampler import Sampler

        return Sampler
    if name == "ForwardBatch":
        from .batch import ForwardBatch

        return ForwardBatch
    if name in _RUNTIME_NAMES:
        runtime = importlib.import_module(".runtime", __name__)
        value = getattr(runtime, name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
