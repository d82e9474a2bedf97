"""Baseline files: the findings a project already has, so a pre-merge run fails only on new ones.

A finding is matched by a line-independent fingerprint (rule, file, function, the text of the offending line),
so edits elsewhere in the file do not resurrect baselined findings; two identical lines in one function are counted.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from flashcheck.errors import InvalidArgument
from flashcheck.findings import Finding, atomic_write_text

__all__ = ["BASELINE_SCHEMA", "apply_baseline", "fingerprint", "load_baseline", "write_baseline"]

BASELINE_SCHEMA = 1


def fingerprint(f: Finding) -> str:
    """Stable identity of a finding across unrelated edits (falls back to `Finding.signature` without a source)."""
    code = f.stack[-1].code if f.stack else ""
    if not code and f.location.file is None:
        return f.signature()
    raw = json.dumps([f.id, f.location.file, f.location.function, " ".join(code.split())])
    return hashlib.sha1(raw.encode()).hexdigest()[:20]


def write_baseline(path: str | Path, findings: Iterable[Finding]) -> int:
    entries = sorted(
        (
            {
                "id": f.id,
                "file": f.location.file,
                "function": f.location.function,
                "line": f.location.line,
                "fingerprint": fingerprint(f),
            }
            for f in findings
        ),
        key=lambda e: (str(e["file"]), int(e["line"] or 0), str(e["id"])),
    )
    doc = {"schema": BASELINE_SCHEMA, "tool": "flashcheck static", "findings": entries}
    atomic_write_text(path, json.dumps(doc, indent=1) + "\n")
    return len(entries)


def load_baseline(path: str | Path) -> Counter[str]:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
        entries = doc["findings"]
        if int(doc.get("schema", 0)) > BASELINE_SCHEMA:
            raise InvalidArgument(f"baseline {path} has schema {doc['schema']}, newer than this flashcheck")
        return Counter(str(e["fingerprint"]) for e in entries)
    except FileNotFoundError as exc:
        raise InvalidArgument(f"baseline {path} does not exist; create it with --write-baseline") from exc
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, InvalidArgument):
            raise
        raise InvalidArgument(
            f"baseline {path} is not a flashcheck baseline ({exc!r}); regenerate it with --write-baseline"
        ) from exc


def apply_baseline(findings: list[Finding], baseline: Counter[str]) -> tuple[list[Finding], int]:
    """Findings not covered by `baseline`, and how many were covered."""
    left = Counter(baseline)
    new: list[Finding] = []
    matched = 0
    for f in findings:
        fp = fingerprint(f)
        if left[fp] > 0:
            left[fp] -= 1
            matched += 1
        else:
            new.append(f)
    return new, matched
