"""pytest plugin (entry point ``pytest11``): markers, GPU skipping, header.

Kept import-light: nothing here imports torch until a ``gpu`` test is collected.
"""

from __future__ import annotations

import functools

import pytest

from flashcheck import __version__


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "fuzz: property-based fuzz tests (built-in suites and @flashcheck.fuzz tests)")
    config.addinivalue_line("markers", "gpu: needs a CUDA device (and usually FlashInfer); skipped otherwise")


@functools.cache
def cuda_unavailable_reason() -> str | None:
    """None when a CUDA device is usable, else why not."""
    try:
        import torch
    except ImportError:
        return "torch is not installed (pip install flashcheck)"
    if not torch.cuda.is_available():
        return "no CUDA device: gpu tests run on GPU nodes (reports/ holds their evidence)"
    return None


def pytest_report_header(config: pytest.Config) -> str:
    return f"flashcheck {__version__}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [it for it in items if it.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    reason = cuda_unavailable_reason()
    if reason is None:
        return
    for it in gpu_items:
        it.add_marker(pytest.mark.skip(reason=reason))
