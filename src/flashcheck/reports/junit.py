"""JUnit XML report: one test case per (check, target), failing when that check found something on that target.

CI systems (GitLab, Jenkins, GitHub test reporters) show each property per target as a test. Every check the run
selected (``run.json`` ``"checks"``) gets a case on every target that ran (a target a campaign dropped as unable to
run here gets none): passing only when the run exercised it there and it found nothing (``"checks_by_target"``,
`flashcheck.exercised`); ``<skipped message="not exercised">`` when it should have run and did not (the run is then
incomplete), ``<skipped message="not applicable: WHY">`` when it cannot apply to that target. A run written before
flashcheck recorded what it exercised shows its listed checks as passing cases, as it did then. Run errors and
every other reason a run is incomplete become one ``<error>`` case, so a crashed run never reads as green.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterable

from flashcheck.findings import Finding
from flashcheck.reports.model import CheckStatus, Entry, FindingStatus, ReportView, evidence_items, lookup_rule

__all__ = ["render"]


def _target_of(f: Finding, default: str) -> str:
    return f.location.target or default


def _finding_text(e: Entry) -> str:
    f = e.finding
    lines = [f"{f.id} {f.name} [{f.severity.value}] {f.location}" + (f" [{e.status.value}]" if e.status else "")]
    lines.append(f"  {f.message}")
    if f.hint:
        lines.append(f"  hint: {f.hint}")
    for k, v in evidence_items(f.evidence):
        lines.append(f"  evidence {k} = {v}")
    if f.stack:
        lines.append("  call chain:" if f.kind == "static" else "  stack (innermost last):")
        lines.extend(f"    {fr}" for fr in f.stack)
    if f.repro:
        lines.append(f"  repro: {f.repro}")
    lines.append(f"  docs: {f.docs}")
    lines.append(f"  signature: {f.signature()}")
    return "\n".join(lines)


def _case(
    parent: ET.Element, classname: str, name: str, entries: list[Entry], fixed: list[Entry], skipped: str | None
) -> None:
    case = ET.SubElement(parent, "testcase", {"classname": classname, "name": name, "time": "0"})
    if skipped is not None and not entries:
        ET.SubElement(case, "skipped", {"message": skipped})
    if entries:
        first = entries[0].finding
        more = f" (and {len(entries) - 1} more)" if len(entries) > 1 else ""
        fail = ET.SubElement(
            case,
            "failure",
            {"message": f"{len(entries)} finding(s): {first.message}{more}", "type": f"{first.id} {first.name}"},
        )
        fail.text = "\n\n".join(_finding_text(e) for e in entries) + "\n"
    if fixed:
        out = ET.SubElement(case, "system-out")
        out.text = "fixed since the baseline:\n" + "\n\n".join(_finding_text(e) for e in fixed) + "\n"


def _properties(parent: ET.Element, items: Iterable[tuple[str, str]]) -> None:
    props = ET.SubElement(parent, "properties")
    for k, v in items:
        ET.SubElement(props, "property", {"name": k, "value": v})


def render(view: ReportView) -> str:
    """The JUnit XML document (one ``<testsuite>`` inside ``<testsuites>``)."""
    default_target = view.target
    cases: dict[tuple[str, str], list[Entry]] = {}
    fixed: dict[tuple[str, str], list[Entry]] = {}
    names: dict[str, str] = {}
    for e in view.entries:
        key = (e.finding.id, _target_of(e.finding, default_target))
        cases.setdefault(key, []).append(e)
        names[e.finding.id] = e.finding.name
    for e in view.fixed:
        key = (e.finding.id, _target_of(e.finding, default_target))
        fixed.setdefault(key, []).append(e)
        names.setdefault(e.finding.id, e.finding.name)
    skipped: dict[tuple[str, str], str] = {}
    for r in view.check_results():  # each selected check on each target that ran (not one a campaign dropped)
        cases.setdefault((r.id, r.target), [])
        if r.status is CheckStatus.NOT_EXERCISED:
            skipped[(r.id, r.target)] = "not exercised"
        elif r.status is CheckStatus.NOT_APPLICABLE:
            skipped[(r.id, r.target)] = f"not applicable: {r.reason}"
    for key in fixed:
        cases.setdefault(key, [])

    keys = sorted(cases)
    failures = sum(1 for k in keys if cases[k])
    problems = view.incomplete_reasons()
    errors = 1 if problems else 0
    duration = f"{view.duration_s or 0.0:.3f}"
    root = ET.Element(
        "testsuites",
        {
            "name": "flashcheck",
            "tests": str(len(keys) + errors),
            "failures": str(failures),
            "errors": str(errors),
            "time": duration,
        },
    )
    suite = ET.SubElement(
        root,
        "testsuite",
        {
            "name": f"flashcheck.{view.run_kind}",
            "tests": str(len(keys) + errors),
            "failures": str(failures),
            "errors": str(errors),
            "skipped": str(sum(1 for k in keys if k in skipped and not cases[k])),
            "time": duration,
        },
    )
    env = [(f"env.{k}", v) for k, v in view.environment() if k != "seed"]
    props = [("seed", view.seed), ("target", view.target), *env]
    if view.compared:
        props += [(f"compare.{s.value}", str(view.count(s))) for s in FindingStatus]
    _properties(suite, props)
    for cid, target in keys:
        name = names.get(cid)
        if name is None:
            # a listed check that found nothing: its name comes from the catalogue (or stays the bare ID)
            name = _registered_name(cid)
        key = (cid, target)
        _case(suite, f"flashcheck.{target}", f"{cid} {name}".strip(), cases[key], fixed.get(key, []), skipped.get(key))
    if problems:  # an incomplete run is never green: one error case with every reason
        case = ET.SubElement(suite, "testcase", {"classname": f"flashcheck.{view.target}", "name": "run", "time": "0"})
        err = ET.SubElement(case, "error", {"message": f"incomplete run: {problems[0]}", "type": "run-error"})
        err.text = "\n".join([*view.errors, *problems[len(view.errors) :]]) + "\n"
    ET.indent(root, space="  ")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _registered_name(cid: str) -> str:
    probe = Finding(id=cid, name="", kind="property", message="-")
    return lookup_rule(probe).name
