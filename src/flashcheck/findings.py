"""The one result model: static, runtime and property checks all produce `Finding` objects.

Findings serialize to stable JSON (`to_dict`/`from_dict`, schema version `FINDING_SCHEMA`), carry where they were
seen (a file:line or a scenario step), the evidence, a fix hint and a reproducer reference, and have a `signature`
used to deduplicate them across a campaign.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from flashcheck._files import atomic_write_text
from flashcheck.errors import InvalidArgument

__all__ = [
    "FINDING_SCHEMA",
    "Confidence",
    "Finding",
    "Frame",
    "Kind",
    "Location",
    "Severity",
    "atomic_write_text",
    "load_findings",
    "save_findings",
]

FINDING_SCHEMA = 1

Kind = Literal["static", "runtime", "property"]
JSON = Any  # JSON-compatible value: the evidence of a finding must survive json.dumps


class Severity(str, enum.Enum):
    """How bad the finding is if it is real."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


class Confidence(str, enum.Enum):
    """How sure the check is that the finding is real (separate axis from severity, as in Bandit)."""

    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


@dataclass(frozen=True)
class Frame:
    """One Python stack frame: where an event or a static finding comes from."""

    file: str
    line: int
    function: str
    code: str = ""

    def to_dict(self) -> dict[str, JSON]:
        return {"file": self.file, "line": self.line, "function": self.function, "code": self.code}

    @classmethod
    def from_dict(cls, d: Mapping[str, JSON]) -> Frame:
        return cls(str(d["file"]), int(d["line"]), str(d["function"]), str(d.get("code", "")))

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


@dataclass(frozen=True)
class Location:
    """Where a finding was seen: a source position, a scenario step, or both."""

    file: str | None = None
    line: int | None = None
    column: int | None = None
    function: str | None = None
    step: int | None = None
    step_name: str | None = None
    region: str | None = None
    target: str | None = None

    def to_dict(self) -> dict[str, JSON]:
        return {k: v for k, v in self.__dict__.items() if v is not None}

    @classmethod
    def from_dict(cls, d: Mapping[str, JSON]) -> Location:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)

    def __str__(self) -> str:
        parts: list[str] = []
        if self.file is not None:
            parts.append(f"{self.file}:{self.line}" + (f":{self.column}" if self.column is not None else ""))
        if self.target is not None:
            parts.append(f"target {self.target}")
        if self.step is not None:
            parts.append(f"step {self.step}" + (f" ({self.step_name})" if self.step_name else ""))
        if self.region is not None:
            parts.append(f"region {self.region}")
        return ", ".join(parts) or "<unknown>"


@dataclass(frozen=True)
class Finding:
    """One result of any check.

    Attributes:
        id: stable check ID (`FC1xx` static, `FC2xx` runtime, `FC3xx` property).
        name: the check's pattern name, e.g. ``csr-well-formed``.
        kind: which layer produced it.
        message: what happened, with the numbers (``kv_indptr[9]=34891 < kv_indptr[8]=36606``).
        hint: what to do about it.
        location: a file:line and/or a scenario step.
        evidence: JSON-compatible facts behind the message (indices, values, byte counts...).
        stack: the Python stack of the offending event, innermost last, or the static call chain.
        repro: a path to a JSON reproducer or a pasteable snippet; None for static findings.
    """

    id: str
    name: str
    kind: Kind
    message: str
    severity: Severity = Severity.ERROR
    confidence: Confidence = Confidence.HIGH
    hint: str = ""
    location: Location = field(default_factory=Location)
    evidence: Mapping[str, JSON] = field(default_factory=dict)
    stack: tuple[Frame, ...] = ()
    repro: str | None = None

    @property
    def docs(self) -> str:
        """Where the check's page is: the command that prints it (reports embed or quote it; no web site)."""
        return f"flashcheck rules {self.id}"

    def signature(self) -> str:
        """Deduplication key: check, place and the evidence fields that do not vary with the input's size."""
        place = (self.location.file, self.location.line, self.location.function, self.location.region)
        key = self.evidence.get("check", "")
        top = self.stack[-1] if self.stack else None
        top_s = f"{top.file}:{top.line}" if top else ""
        raw = json.dumps([self.id, place, key, top_s, self.location.target], default=str)
        return hashlib.sha1(raw.encode()).hexdigest()[:16]

    def with_repro(self, repro: str) -> Finding:
        return dataclasses.replace(self, repro=repro)

    def with_location(self, **changes: JSON) -> Finding:
        return dataclasses.replace(self, location=dataclasses.replace(self.location, **changes))

    def to_dict(self) -> dict[str, JSON]:
        return {
            "schema": FINDING_SCHEMA,
            "id": self.id,
            "name": self.name,
            "kind": self.kind,
            "severity": self.severity.value,
            "confidence": self.confidence.value,
            "message": self.message,
            "hint": self.hint,
            "location": self.location.to_dict(),
            "evidence": dict(self.evidence),
            "stack": [f.to_dict() for f in self.stack],
            "repro": self.repro,
            "docs": self.docs,
            "signature": self.signature(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, JSON]) -> Finding:
        try:
            if int(d.get("schema", FINDING_SCHEMA)) > FINDING_SCHEMA:
                raise InvalidArgument(
                    f"finding schema {d['schema']} is newer than this flashcheck understands "
                    f"({FINDING_SCHEMA}); upgrade flashcheck"
                )
            kind = str(d["kind"])
            if kind not in ("static", "runtime", "property"):
                raise InvalidArgument(f"finding kind {kind!r} is not one of static, runtime, property")
            return cls(
                id=str(d["id"]),
                name=str(d["name"]),
                kind=kind,  # type: ignore[arg-type]
                message=str(d["message"]),
                severity=Severity(d.get("severity", "error")),
                confidence=Confidence(d.get("confidence", "high")),
                hint=str(d.get("hint", "")),
                location=Location.from_dict(d.get("location", {})),
                evidence=dict(d.get("evidence", {})),
                stack=tuple(Frame.from_dict(f) for f in d.get("stack", [])),
                repro=d.get("repro"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, InvalidArgument):
                raise
            raise InvalidArgument(f"not a flashcheck finding: {exc!r} in {dict(d)!r:.200}") from exc

    def __str__(self) -> str:
        s = f"{self.id} {self.name} [{self.severity.value}] {self.location}: {self.message}"
        if self.hint:
            s += f"\n    hint: {self.hint}"
        return s


def save_findings(path: str | os.PathLike[str], findings: Iterable[Finding]) -> None:
    """Write findings as a JSON document (atomically)."""
    doc = {"schema": FINDING_SCHEMA, "findings": [f.to_dict() for f in findings]}
    atomic_write_text(path, json.dumps(doc, indent=2, sort_keys=True) + "\n")


def load_findings(path: str | os.PathLike[str]) -> list[Finding]:
    """Read findings written by `save_findings` (or a single finding object)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise InvalidArgument(f"findings file {path} does not exist") from exc
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"findings file {path} is not JSON: {exc}") from exc
    items: Sequence[Mapping[str, JSON]]
    if isinstance(doc, dict) and "findings" in doc:
        items = doc["findings"]
    elif isinstance(doc, dict):
        items = [doc]
    else:
        items = doc
    return [Finding.from_dict(d) for d in items]
