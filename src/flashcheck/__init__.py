"""flashcheck: verification and fuzzing for the code serving engines write around FlashInfer and CUDA graphs.

The public surface is small and lazy: ``import flashcheck`` imports neither torch nor FlashInfer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it (imported on first attribute access)
_LAZY: dict[str, str] = {
    "BatchSpec": "flashcheck.batch",
    "PagedLayout": "flashcheck.layout",
    "RaggedLayout": "flashcheck.layout",
    "PaddingPolicy": "flashcheck.layout",
    "build_paged_layout": "flashcheck.layout",
    "build_ragged_layout": "flashcheck.layout",
    "Finding": "flashcheck.findings",
    "Location": "flashcheck.findings",
    "Severity": "flashcheck.findings",
    "Confidence": "flashcheck.findings",
    "FlashcheckError": "flashcheck.errors",
    "UsageError": "flashcheck.errors",
    "InvalidArgument": "flashcheck.errors",
    "InvalidDefinition": "flashcheck.errors",
    "EnvironmentUnavailable": "flashcheck.errors",
    "ViolationFound": "flashcheck.errors",
    "hot_path": "flashcheck.markers",
    "fuzz": "flashcheck.fuzz",  # the package is callable: @flashcheck.fuzz(target=..., budget=...)
}

__all__ = [
    "BatchSpec",
    "Confidence",
    "EnvironmentUnavailable",
    "Finding",
    "FlashcheckError",
    "InvalidArgument",
    "InvalidDefinition",
    "Location",
    "PaddingPolicy",
    "PagedLayout",
    "RaggedLayout",
    "Severity",
    "UsageError",
    "ViolationFound",
    "__version__",
    "build_paged_layout",
    "build_ragged_layout",
    "fuzz",
    "hot_path",
]

if TYPE_CHECKING:
    from flashcheck.batch import BatchSpec
    from flashcheck.errors import (
        EnvironmentUnavailable,
        FlashcheckError,
        InvalidArgument,
        InvalidDefinition,
        UsageError,
        ViolationFound,
    )
    from flashcheck.findings import Confidence, Finding, Location, Severity
    from flashcheck.layout import (
        PaddingPolicy,
        PagedLayout,
        RaggedLayout,
        build_paged_layout,
        build_ragged_layout,
    )
    from flashcheck.markers import hot_path


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'flashcheck' has no attribute {name!r}")
    module = importlib.import_module(mod)
    value = module if mod == f"{__name__}.{name}" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
