"""Environment variables, read lazily through the module's ``__getattr__`` (vLLM's ``envs`` idiom)."""

import os
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    VLLM_LOGGING_LEVEL: str = "INFO"
    VLLM_USE_TRTLLM_DECODE_ATTENTION: bool = False
    VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE: int = 0
    VLLM_CUDAGRAPH_GC_DISABLE: bool = True

environment_variables: dict[str, Callable[[], Any]] = {
    "VLLM_LOGGING_LEVEL": lambda: os.getenv("VLLM_LOGGING_LEVEL", "INFO").upper(),
    "VLLM_USE_TRTLLM_DECODE_ATTENTION": lambda: os.getenv("VLLM_USE_TRTLLM_DECODE_ATTENTION", "0") == "1",
    "VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE": lambda: int(
        os.getenv("VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE", "402653184")
    ),
    "VLLM_CUDAGRAPH_GC_DISABLE": lambda: os.getenv("VLLM_CUDAGRAPH_GC_DISABLE", "1") == "1",
}


def __getattr__(name: str) -> Any:
    if name in environment_variables:
        return environment_variables[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return list(environment_variables.keys())
