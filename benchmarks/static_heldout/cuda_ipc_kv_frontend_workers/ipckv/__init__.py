"""KV pages shared between a frontend and its workers through CUDA IPC handles."""

from .config import IpcServeConfig
from .handles import IpcHandle, IpcPageRegistry
from .limits import GRAPH_WS_BYTES, MAX_WORKERS, PAGE_SIZES
from .pool import SharedPagePool
from .protocol import StepMessage, StepResult

__all__ = [
    "GRAPH_WS_BYTES",
    "IpcHandle",
    "IpcPageRegistry",
    "IpcServeConfig",
    "MAX_WORKERS",
    "PAGE_SIZES",
    "SharedPagePool",
    "StepMessage",
    "StepResult",
]
