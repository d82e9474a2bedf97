"""Registry of every check flashcheck runs, static rules, runtime detectors and properties alike.

Each check has a stable ID, a pattern name and a docstring page with fixed sections (see `REQUIRED_SECTIONS`);
`flashcheck rules ID` prints it, and the test suite fails when a page lacks a section. Check modules register
themselves at import; `all_checks()` imports the known modules lazily (none of them imports torch).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from flashcheck.errors import InvalidArgument, InvalidDefinition
from flashcheck.findings import Confidence, Kind, Severity

__all__ = ["REQUIRED_SECTIONS", "CheckInfo", "all_checks", "get_check", "register_check"]

REQUIRED_SECTIONS = ("What it checks", "Why it breaks serving", "Example", "Use instead", "Known false positives")
_ID_RE = re.compile(r"^FC[1-3]\d\d$")
_NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_KIND_PREFIX: dict[Kind, str] = {"static": "FC1", "runtime": "FC2", "property": "FC3"}

# Packages whose modules register checks when imported (every module in them is imported on demand; none of
# them may import torch at import time). A missing package (an optional subsystem) is skipped.
CHECK_PACKAGES: tuple[str, ...] = (
    "flashcheck.properties",
    "flashcheck.runtime.checks",
    "flashcheck.verifier.rules",
    "flashcheck.targets.classify",
    "flashcheck.campaign.checks",
    "flashcheck.watchdog",
)


@dataclass(frozen=True)
class CheckInfo:
    """What the registry knows of one check."""

    id: str
    name: str
    kind: Kind
    summary: str
    doc: str
    severity: Severity
    confidence: Confidence

    def page(self) -> str:
        return f"{self.id} {self.name} ({self.kind})\n\n{self.doc}\n"

    def missing_sections(self) -> list[str]:
        return [s for s in REQUIRED_SECTIONS if not re.search(rf"^\s*{re.escape(s)}\s*$", self.doc, re.M)]


_REGISTRY: dict[str, CheckInfo] = {}
T = TypeVar("T")


def register_check(
    id: str,
    name: str,
    kind: Kind,
    *,
    severity: Severity = Severity.ERROR,
    confidence: Confidence = Confidence.HIGH,
) -> Callable[[T], T]:
    """Class or function decorator: register the decorated object's docstring as the page of check `id`."""
    if not _ID_RE.match(id):
        raise InvalidDefinition(f"check ID {id!r} must look like FC1xx (static), FC2xx (runtime) or FC3xx (property)")
    if not id.startswith(_KIND_PREFIX[kind]):
        raise InvalidDefinition(f"check ID {id!r} is a {kind} check and must start with {_KIND_PREFIX[kind]}")
    if not _NAME_RE.match(name):
        raise InvalidDefinition(f"check name {name!r} must be lower-case words joined by '-'")

    def deco(obj: T) -> T:
        doc = inspect.cleandoc(getattr(obj, "__doc__", None) or "")
        if not doc:
            raise InvalidDefinition(f"check {id} ({name}) has no docstring page")
        summary = doc.splitlines()[0]
        info = CheckInfo(id, name, kind, summary, doc, severity, confidence)
        old = _REGISTRY.get(id)
        if old is not None and old.name != name:
            raise InvalidDefinition(f"check ID {id} registered twice: {old.name!r} and {name!r}")
        _REGISTRY[id] = info
        return obj

    return deco


def _load_all() -> None:
    for pkg_name in CHECK_PACKAGES:
        try:
            pkg = importlib.import_module(pkg_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and pkg_name.startswith(exc.name):
                continue
            raise
        for info in pkgutil.iter_modules(getattr(pkg, "__path__", [])):
            importlib.import_module(f"{pkg_name}.{info.name}")


def all_checks() -> list[CheckInfo]:
    """Every registered check, sorted by ID."""
    _load_all()
    return sorted(_REGISTRY.values(), key=lambda c: c.id)


def get_check(id_or_name: str) -> CheckInfo:
    """Look a check up by ID (``FC301``) or name (``csr-well-formed``)."""
    _load_all()
    key = id_or_name.strip()
    if key.upper() in _REGISTRY:
        return _REGISTRY[key.upper()]
    for info in _REGISTRY.values():
        if info.name == key:
            return info
    known = ", ".join(sorted(_REGISTRY))
    raise InvalidArgument(f"unknown check {id_or_name!r}; known checks: {known}")
