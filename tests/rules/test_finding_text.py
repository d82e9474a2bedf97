"""What each fixture finding tells the user: message, hint, confidence, severity and evidence, compared with
``fixtures/findings.json``. The line-exact tests (test_fixtures.py) say *where* a rule fires; this says *what* it
reports there, so a changed operand snippet, root, chain, confidence or evidence field is noticed.

After an intended change of wording, rewrite the file and review its diff:

    FLASHCHECK_UPDATE_FINDINGS=1 python -m pytest -q -n 0 tests/rules/test_finding_text.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from flashcheck.findings import Finding
from flashcheck.verifier import StaticConfig, check_paths, load_config

from .test_fixtures import FIXTURE_FILES, FIXTURES, PROJECTS, annotations

GOLDEN = FIXTURES / "findings.json"
_KEPT = ("id", "severity", "confidence", "message", "hint", "evidence")


def _entry(f: Finding) -> dict[str, object]:
    d = f.to_dict()
    loc = d["location"]
    assert isinstance(loc, dict)
    return {"at": f"{loc.get('file')}:{loc.get('line')}", **{k: d[k] for k in _KEPT}}


def _annotated_ids(paths: list[Path]) -> set[str]:
    ids: set[str] = set()
    for p in paths:
        notes = annotations(p)
        ids |= set(notes["expect"]) | set(notes["ok"])
    return ids


def current() -> dict[str, list[dict[str, object]]]:
    """Fixture name -> its findings of the rules it annotates, in report order."""
    out: dict[str, list[dict[str, object]]] = {}
    for fixture in FIXTURE_FILES:
        ids = _annotated_ids([fixture])
        result = check_paths([str(fixture)], StaticConfig(root=str(FIXTURES)))
        out[fixture.name] = [_entry(f) for f in result.findings if f.id in ids]
    for project in PROJECTS:
        pyproject = project / "pyproject.toml"
        config = load_config(pyproject) if pyproject.is_file() else StaticConfig(root=str(project))
        ids = _annotated_ids(sorted(project.rglob("*.py")))
        result = check_paths([str(project)], config)
        out[project.name] = [_entry(f) for f in result.findings if f.id in ids]
    return out


def test_fixture_findings_say_what_findings_json_records() -> None:
    got = current()
    if os.environ.get("FLASHCHECK_UPDATE_FINDINGS"):
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    want = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert sorted(got) == sorted(want), "fixtures added or removed: rewrite findings.json (see the docstring)"
    for name in sorted(want):
        assert got[name] == want[name], name
