"""flashcheck: verification and fuzzing for the code serving engines write around FlashInfer and CUDA graphs.

The public surface is small and lazy: ``import flashcheck`` imports neither torch nor FlashInfer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flashcheck._lazy import lazy_attributes

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
    from flashcheck.fuzzing.api import fuzz
    from flashcheck.layout import (
        PaddingPolicy,
        PagedLayout,
        RaggedLayout,
        build_paged_layout,
        build_ragged_layout,
    )
    from flashcheck.markers import hot_path
else:

    def fuzz(*args: Any, **kwargs: Any) -> Any:
        """``@flashcheck.fuzz(target=..., budget=...)``: a fuzz test of replay sequences against a target; see
        `flashcheck.fuzzing.api.fuzz` (imported on first use: ``import flashcheck`` stays free of Hypothesis)."""
        from flashcheck.fuzzing.api import fuzz

        return fuzz(*args, **kwargs)


__getattr__ = lazy_attributes(__name__, _LAZY)


def __dir__() -> list[str]:
    return sorted(__all__)
