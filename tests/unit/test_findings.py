"""Finding model: stable JSON, atomic saving, clear errors on malformed input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flashcheck.errors import InvalidArgument, ViolationFound
from flashcheck.findings import Confidence, Finding, Frame, Location, Severity, load_findings, save_findings

F = Finding(
    id="FC301",
    name="csr-well-formed",
    kind="property",
    message="kv_indptr[9]=34891 < kv_indptr[8]=36606",
    hint="h",
    severity=Severity.ERROR,
    confidence=Confidence.HIGH,
    location=Location(step=3, step_name="replay bs=16", target="decode"),
    evidence={"check": "x", "index": 9},
    stack=(Frame("a.py", 3, "f", "x.tolist()"),),
    repro="repro.json",
)


def test_round_trip_and_stable_keys(tmp_path: Path) -> None:
    d = F.to_dict()
    assert sorted(d) == sorted(
        [
            "schema",
            "id",
            "name",
            "kind",
            "severity",
            "confidence",
            "message",
            "hint",
            "location",
            "evidence",
            "stack",
            "repro",
            "docs",
            "signature",
        ]
    )
    assert Finding.from_dict(json.loads(json.dumps(d))) == F
    save_findings(tmp_path / "f.json", [F, F.with_location(step=4)])
    assert load_findings(tmp_path / "f.json")[1].location.step == 4
    assert not list(tmp_path.glob(".*tmp"))


def test_signature_ignores_step_but_not_place() -> None:
    assert F.signature() == F.with_location(step=99).signature()
    assert F.signature() != F.with_location(region="replay").signature()


def test_malformed_inputs(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="does not exist"):
        load_findings(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(InvalidArgument, match="is not JSON"):
        load_findings(tmp_path / "bad.json")
    with pytest.raises(InvalidArgument, match="not a flashcheck finding"):
        Finding.from_dict({"id": "FC301"})
    with pytest.raises(InvalidArgument, match="kind 'other'"):
        Finding.from_dict({**F.to_dict(), "kind": "other"})
    with pytest.raises(InvalidArgument, match="newer than this flashcheck"):
        Finding.from_dict({**F.to_dict(), "schema": 99})


def test_violation_found_carries_findings() -> None:
    err = ViolationFound([F])
    assert err.findings == (F,) and "kv_indptr[9]" in str(err) and isinstance(err, AssertionError)


def test_import_does_not_import_torch() -> None:
    code = (
        "import sys, flashcheck; flashcheck.BatchSpec; flashcheck.Finding; import flashcheck.cli; "
        "import flashcheck.catalogue as r; r.all_checks(); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
