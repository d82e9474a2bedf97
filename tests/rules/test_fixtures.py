"""Every annotated fixture line is checked exactly: `# expect: ID` must fire there, `# ok: ID` must stay quiet.

Each fixture is checked as a project of its own with every rule selected; findings of a rule are compared with the
annotations only in files that annotate that rule, so a fixture documents exactly the rules it names. A fixture is a
file, or a directory (``engine_*``: an engine-shaped project, with its ``pyproject.toml`` hot-path configuration and
no ``__init__.py``, so its imports resolve as namespace packages).
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest

from flashcheck.verifier import StaticConfig, check_paths, load_config
from flashcheck.verifier.engine import static_rules

FIXTURES = Path(__file__).parent / "fixtures"
_ANNOTATION = re.compile(r"#\s*(expect|ok):\s*(FC\d{3}(?:\s*,\s*FC\d{3})*)")


def annotations(path: Path) -> dict[str, dict[str, set[int]]]:
    """{"expect"|"ok": {rule ID: {line numbers}}} read from the fixture's comments."""
    out: dict[str, dict[str, set[int]]] = {"expect": defaultdict(set), "ok": defaultdict(set)}
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        for kind, ids in _ANNOTATION.findall(line):
            for rule_id in re.split(r"\s*,\s*", ids):
                out[kind][rule_id].add(lineno)
    return out


FIXTURE_FILES = sorted(FIXTURES.glob("*.py"))
PROJECTS = sorted(p for p in FIXTURES.iterdir() if p.is_dir() and p.name.startswith("engine_"))
ALL_ANNOTATED = FIXTURE_FILES + [f for d in PROJECTS for f in sorted(d.rglob("*.py"))]


@pytest.mark.parametrize("fixture", FIXTURE_FILES, ids=lambda p: p.stem)
def test_fixture_lines_fire_exactly_where_annotated(fixture: Path) -> None:
    notes = annotations(fixture)
    ids = set(notes["expect"]) | set(notes["ok"])
    assert ids, f"{fixture.name} has no annotations"
    result = check_paths([str(fixture)], StaticConfig(root=str(FIXTURES)))
    assert result.internal_errors == []
    fired: dict[str, set[int]] = defaultdict(set)
    for f in result.findings:
        if f.id in ids:
            assert f.location.file == fixture.name
            fired[f.id].add(int(f.location.line or 0))
    for rule_id in sorted(ids):
        expected = notes["expect"].get(rule_id, set())
        quiet = notes["ok"].get(rule_id, set())
        assert not expected & quiet, f"{rule_id}: a line is annotated both expect and ok"
        assert sorted(fired[rule_id]) == sorted(expected), (
            f"{fixture.name} {rule_id}: fired on {sorted(fired[rule_id])}, annotated {sorted(expected)}; "
            f"stray: {sorted(fired[rule_id] - expected)}, missed: {sorted(expected - fired[rule_id])}"
        )


@pytest.mark.parametrize("project", PROJECTS, ids=lambda p: p.name)
def test_engine_project_lines_fire_exactly_where_annotated(project: Path) -> None:
    pyproject = project / "pyproject.toml"
    config = load_config(pyproject) if pyproject.is_file() else StaticConfig(root=str(project))
    result = check_paths([str(project)], config)
    assert result.internal_errors == []
    fired: dict[tuple[str, str], set[int]] = defaultdict(set)
    for f in result.findings:
        fired[(f.location.file or "", f.id)].add(int(f.location.line or 0))
    checked = 0
    for path in sorted(project.rglob("*.py")):
        rel = path.relative_to(project).as_posix()
        notes = annotations(path)
        for rule_id in sorted(set(notes["expect"]) | set(notes["ok"])):
            expected = notes["expect"].get(rule_id, set())
            assert not expected & notes["ok"].get(rule_id, set()), f"{rel} {rule_id}: a line is expect and ok"
            got = fired[(rel, rule_id)]
            assert sorted(got) == sorted(expected), (
                f"{project.name}/{rel} {rule_id}: fired on {sorted(got)}, annotated {sorted(expected)}; "
                f"stray: {sorted(got - expected)}, missed: {sorted(expected - got)}"
            )
            checked += len(expected)
    assert checked > 0


def test_engine_projects_resolve_imports_between_namespace_packages() -> None:
    """`srt/` has no ``__init__.py``: the runner's import of the backend must still reach its methods."""
    project = FIXTURES / "engine_sglang"
    result = check_paths([str(project)], StaticConfig(root=str(project), select=("FC104",)))
    by_line = {(f.location.file, f.location.line): f for f in result.findings}
    runner = by_line[("srt/model_executor/cuda_graph_runner.py", 34)]
    assert runner.evidence["bound_in"] == (
        "srt.layers.attention.flashinfer_backend.FlashInferAttnBackend.init_forward_metadata_capture_cuda_graph"
    )


def test_every_rule_has_must_fire_and_must_stay_quiet_fixtures() -> None:
    expect: set[str] = set()
    ok: set[str] = set()
    for path in ALL_ANNOTATED:
        notes = annotations(path)
        expect |= {k for k, v in notes["expect"].items() if v}
        ok |= {k for k, v in notes["ok"].items() if v}
    rules = set(static_rules())
    assert rules - expect == set(), "rules without a must-fire fixture line"
    assert rules - ok == set(), "rules without a must-stay-quiet fixture line"


def test_hot_path_findings_name_the_call_chain_from_the_root() -> None:
    result = check_paths([str(FIXTURES / "fc101_host_sync.py")], StaticConfig(root=str(FIXTURES), select=("FC101",)))
    by_line = {f.location.line: f for f in result.findings}
    nested = by_line[19]  # int(self.kv_indptr[bs]) in FlashInferIndicesUpdater.update
    assert nested.evidence["chain"] == [
        "PyFlashInferPrefillImpl.init_forward_metadata_replay_cuda_graph",
        "FlashInferIndicesUpdater.update",
    ]
    assert [(fr.function, fr.line) for fr in nested.stack][-2:] == [
        ("PyFlashInferPrefillImpl.init_forward_metadata_replay_cuda_graph", 62),
        ("FlashInferIndicesUpdater.update", 19),
    ]
    assert nested.evidence["root_kind"] == "step"
