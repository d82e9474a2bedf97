"""GPU tests: every test here is marked ``gpu`` (skipped with a reason without CUDA)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for it in items:
        if "tests/gpu/" in str(it.fspath).replace("\\", "/"):
            it.add_marker(pytest.mark.gpu)
