"""PLACEHOLDER until the runtime branch lands: regions without detectors."""

from __future__ import annotations

from typing import Any

from flashcheck.runtime.api import NullChecker
from flashcheck.runtime.arena import Arena

__all__ = ["Checker"]


class Checker(NullChecker):
    def __init__(self, *, layers: str = "all", device: Any = None) -> None:
        super().__init__(Arena())

    def __enter__(self) -> Checker:
        return self

    def __exit__(self, *exc: object) -> None:
        return None
