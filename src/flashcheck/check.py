"""A check: one stable ID, its pattern name, its page and the constructor of its findings.

Every check is one `Check` object defined in the module that implements it; every other module imports that object
instead of repeating its ID or name. `flashcheck.catalogue` lists the modules that define checks, and the test
suite fails when a page lacks one of `REQUIRED_SECTIONS`.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flashcheck.errors import InvalidDefinition
from flashcheck.findings import Confidence, Finding, Frame, Kind, Location, Severity

__all__ = ["REQUIRED_SECTIONS", "Check"]

REQUIRED_SECTIONS = ("What it checks", "Why it breaks serving", "Example", "Use instead", "Known false positives")
_ID_RE = re.compile(r"^FC[1-3]\d\d$")
_NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_KIND_PREFIX: dict[Kind, str] = {"static": "FC1", "runtime": "FC2", "property": "FC3"}


@dataclass(frozen=True)
class Check:
    """One check.

    Attributes:
        id: stable ID, ``FC1xx`` static, ``FC2xx`` runtime, ``FC3xx`` property.
        name: the pattern name, lower-case words joined by ``-`` (``csr-well-formed``).
        kind: which layer runs it.
        doc: the page: a one-line summary, then the sections of `REQUIRED_SECTIONS` (``flashcheck rules ID``).
        severity, confidence: of its findings unless a finding says otherwise.
        hint: what to do, for findings that give no hint of their own.
        layer: for a runtime check that one detection layer alone runs (and only on a CUDA device), that layer's
            name: a run lists the check as run only when the layer was selected there.
    """

    id: str
    name: str
    kind: Kind
    doc: str = field(repr=False)
    severity: Severity = Severity.ERROR
    confidence: Confidence = Confidence.HIGH
    hint: str = field(default="", repr=False)
    layer: str | None = None

    def __post_init__(self) -> None:
        if not _ID_RE.match(self.id):
            raise InvalidDefinition(
                f"check ID {self.id!r} must look like FC1xx (static), FC2xx (runtime) or FC3xx (property)"
            )
        prefix = _KIND_PREFIX.get(self.kind)
        if prefix is None:
            raise InvalidDefinition(f"check {self.id} has kind {self.kind!r}; use static, runtime or property")
        if not self.id.startswith(prefix):
            raise InvalidDefinition(f"check ID {self.id!r} is a {self.kind} check and must start with {prefix}")
        if not _NAME_RE.match(self.name):
            raise InvalidDefinition(f"check name {self.name!r} must be lower-case words joined by '-'")
        doc = inspect.cleandoc(self.doc or "")
        if not doc:
            raise InvalidDefinition(f"check {self.id} ({self.name}) has no page")
        object.__setattr__(self, "doc", doc)

    @property
    def summary(self) -> str:
        """The first line of the page."""
        return self.doc.splitlines()[0]

    def page(self) -> str:
        """The page as ``flashcheck rules ID`` prints it."""
        return f"{self.id} {self.name} ({self.kind})\n\n{self.doc}\n"

    def missing_sections(self) -> list[str]:
        return [s for s in REQUIRED_SECTIONS if not re.search(rf"^\s*{re.escape(s)}\s*$", self.doc, re.M)]

    def finding(
        self,
        message: str,
        *,
        location: Location | None = None,
        evidence: Mapping[str, Any] | None = None,
        hint: str | None = None,
        stack: tuple[Frame, ...] = (),
        severity: Severity | None = None,
        confidence: Confidence | None = None,
        repro: str | None = None,
    ) -> Finding:
        """A finding of this check: `message` says what happened, with the numbers; `hint` (default: the check's)
        what to do about it; `repro` the reproducer that shows it, when there is one."""
        return Finding(
            id=self.id,
            name=self.name,
            kind=self.kind,
            message=message,
            severity=severity or self.severity,
            confidence=confidence or self.confidence,
            hint=self.hint if hint is None else hint,
            location=location or Location(),
            evidence=dict(evidence or {}),
            stack=stack,
            repro=repro,
        )
