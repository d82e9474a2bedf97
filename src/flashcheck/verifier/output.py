"""Renderers over a list of `Finding`: text, JSON, SARIF 2.1.0 and JUnit XML.

They take plain findings (static, runtime or property alike) so reports can reuse them; rule metadata for SARIF
comes from the check registry. Paths in findings are taken as relative to `root` (SARIF ``%SRCROOT%``).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from flashcheck import __version__
from flashcheck.errors import InvalidArgument
from flashcheck.findings import FINDING_SCHEMA, Finding, Severity
from flashcheck.verifier.baseline import fingerprint

__all__ = ["FORMATS", "Format", "render", "render_json", "render_junit", "render_sarif", "render_text"]

Format = Literal["text", "json", "sarif", "junit"]
FORMATS: tuple[Format, ...] = ("text", "json", "sarif", "junit")
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}


def render(
    fmt: str,
    findings: Sequence[Finding],
    *,
    root: str | Path | None = None,
    files: Sequence[str] = (),
    summary: str = "",
) -> str:
    if fmt == "text":
        return render_text(findings, summary=summary)
    if fmt == "json":
        return render_json(findings)
    if fmt == "sarif":
        return render_sarif(findings, root=root)
    if fmt == "junit":
        return render_junit(findings, files=files)
    raise InvalidArgument(f"unknown output format {fmt!r}; use one of {', '.join(FORMATS)}")


def render_text(findings: Sequence[Finding], *, summary: str = "") -> str:
    """``file:line:col: ID [severity] message`` with the hint and, for hot-path findings, the call chain."""
    out: list[str] = []
    for f in findings:
        loc = f.location
        where = f"{loc.file}:{loc.line}:{loc.column or 1}" if loc.file else str(loc)
        out.append(f"{where}: {f.id} {f.name} [{f.severity.value}, {f.confidence.value} confidence] {f.message}")
        chain = f.evidence.get("chain")
        if chain:
            out.append(f"    chain: {' -> '.join(str(c) for c in chain)}")
        if f.hint:
            out.append(f"    hint: {f.hint}")
    if findings:
        counts = Counter(f.id for f in findings)
        out.append("")
        out.append("by rule: " + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())))
    if summary:
        out.append(summary)
    return "\n".join(out) + "\n"


def render_json(findings: Sequence[Finding]) -> str:
    """The `flashcheck.findings.save_findings` document (one schema for every producer)."""
    doc = {"schema": FINDING_SCHEMA, "findings": [f.to_dict() for f in findings]}
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def _rule_meta(rule_id: str, name: str) -> dict[str, Any]:
    from flashcheck.registry import get_check

    meta: dict[str, Any] = {"id": rule_id, "name": name, "shortDescription": {"text": name}}
    try:
        info = get_check(rule_id)
    except InvalidArgument:
        return meta
    meta["shortDescription"] = {"text": info.summary}
    meta["fullDescription"] = {"text": info.summary}
    meta["help"] = {"text": info.doc}
    meta["defaultConfiguration"] = {"level": _LEVEL[info.severity]}
    meta["properties"] = {"tags": [info.kind, "flashcheck"], "precision": _precision(info.confidence.value)}
    return meta


def _precision(conf: str) -> str:
    return {"high": "high", "medium": "medium", "low": "low"}.get(conf, "medium")


def _physical(file: str, line: int | None, column: int | None = None) -> dict[str, Any]:
    region: dict[str, Any] = {"startLine": max(int(line or 1), 1)}
    if column:
        region["startColumn"] = max(int(column), 1)
    return {
        "physicalLocation": {
            "artifactLocation": {"uri": Path(file).as_posix(), "uriBaseId": "%SRCROOT%"},
            "region": region,
        }
    }


def render_sarif(findings: Sequence[Finding], *, root: str | Path | None = None) -> str:
    """SARIF 2.1.0 (accepted by code-scanning services): one run, rules with help text, call chains as codeFlows."""
    rules: list[dict[str, Any]] = []
    index: dict[str, int] = {}
    results: list[dict[str, Any]] = []
    for f in findings:
        if f.id not in index:
            index[f.id] = len(rules)
            rules.append(_rule_meta(f.id, f.name))
        res: dict[str, Any] = {
            "ruleId": f.id,
            "ruleIndex": index[f.id],
            "level": _LEVEL[f.severity],
            "message": {"text": f.message + (f"\nHint: {f.hint}" if f.hint else "")},
            "partialFingerprints": {"flashcheckFingerprint/v1": fingerprint(f)},
            "properties": {"confidence": f.confidence.value, "kind": f.kind},
        }
        if f.location.file:
            res["locations"] = [_physical(f.location.file, f.location.line, f.location.column)]
        if len(f.stack) > 1:
            res["codeFlows"] = [
                {
                    "threadFlows": [
                        {
                            "locations": [
                                {"location": {**_physical(fr.file, fr.line), "message": {"text": fr.function}}}
                                for fr in f.stack
                            ]
                        }
                    ]
                }
            ]
        results.append(res)
    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "flashcheck",
                "version": __version__,
                "semanticVersion": __version__,
                "rules": rules,
            }
        },
        "results": results,
        "columnKind": "unicodeCodePoints",
    }
    if root is not None:
        run["originalUriBaseIds"] = {"%SRCROOT%": {"uri": Path(root).resolve().as_uri() + "/"}}
    doc = {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}
    return json.dumps(doc, indent=2) + "\n"


def render_junit(findings: Sequence[Finding], *, files: Sequence[str] = (), suite: str = "flashcheck") -> str:
    """One failing test case per finding, one passing case per clean file in `files` (or one overall case)."""
    suites = ET.Element("testsuites")
    ts = ET.SubElement(suites, "testsuite", name=suite)
    dirty = {f.location.file for f in findings}
    cases = 0
    for f in findings:
        cases += 1
        loc = f"{f.location.file}:{f.location.line}" if f.location.file else str(f.location)
        tc = ET.SubElement(ts, "testcase", classname=f.location.file or suite, name=f"{f.id} {f.name} at {loc}")
        fail = ET.SubElement(tc, "failure", message=f.message, type=f.id)
        fail.text = f"{loc}: {f.message}\nhint: {f.hint}\ndocs: {f.docs}"
    clean = [p for p in files if p not in dirty]
    for p in clean:
        cases += 1
        ET.SubElement(ts, "testcase", classname=p, name="flashcheck static")
    if cases == 0:
        cases = 1
        ET.SubElement(ts, "testcase", classname=suite, name="no findings")
    ts.set("tests", str(cases))
    ts.set("failures", str(len(findings)))
    ts.set("errors", "0")
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"
