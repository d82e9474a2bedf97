"""Shared test configuration: Hypothesis profiles sized for 2-core CI, and the slow tests first."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` run first: in a parallel run (``-n``) the long ones start at once on every worker
    instead of leaving one worker busy at the end (the order is otherwise kept)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
