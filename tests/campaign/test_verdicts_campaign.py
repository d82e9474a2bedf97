"""One campaign over faulty targets of every verdict family and a clean control (CPU analogs of the GPU evidence):
it runs its whole budget, finds each faulty target by its intended check, finds nothing in the clean one, drops no
target as unavailable, and every reproducer replays to the same finding in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flashcheck.cli import main
from tests.campaign.conftest import findings_of, read_json, subprocess_env

QUALITY = Path(__file__).resolve().parents[1] / "quality"
FAULTY = {
    "faulty_verdicts:FaultSurfacesLater": "FC250",
    "faulty_verdicts:SpinsInPrepareReplay": "FC252",
    "faulty_verdicts:RaisesOnValidInput": "FC250",
    "faulty_verdicts:EagerHostSync": "FC201",
    "faulty_verdicts:ExtraPaddedRow": "FC305",
}


@pytest.mark.slow
def test_a_multi_target_campaign_finds_every_faulty_target_and_stays_quiet_on_the_clean_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(QUALITY))
    out = tmp_path / "run"
    targets = [*FAULTY, "cpu-reference"]
    small = json.dumps({"max_kv_len": 256, "chunk": 32, "max_pages": 256})
    rc = main(
        [
            "campaign",
            "--target",
            ",".join(targets),
            "--target-config",
            small,
            "--layers",
            "all",
            "--steps",
            "120",
            "--chunk-steps",
            "20",
            "--seed",
            "7",
            "--step-timeout",
            "3s",
            "--warm-up-scale",
            "1.5",  # CPU targets compile nothing: hangs in a first replay are found in 1.5 timeouts
            "--log-every",
            "3600",
            "--out",
            str(out),
        ]
    )
    assert rc == 1
    meta = read_json(out / "run.json")
    assert meta["stats"]["steps"] >= 120 - len(targets)  # the whole budget (hung steps are not counted as run)
    assert meta["campaign"].get("dropped", {}) == {}, "no target may be dropped as unavailable"
    found = findings_of(out)
    by_target: dict[str, set[str]] = {}
    for f in found:
        by_target.setdefault(f["location"]["target"], set()).add(f["id"])
    names = {t: t.split(":")[1] for t in FAULTY}
    import faulty_verdicts as fv

    for spec, check in FAULTY.items():
        name = getattr(fv, names[spec]).name
        assert check in by_target.get(name, set()), (spec, by_target)
    assert "cpu-reference" not in by_target
    env = subprocess_env()
    env["PYTHONPATH"] = f"{QUALITY}:{env['PYTHONPATH']}"
    for f in found:
        repro = out / f["repro"]
        res = subprocess.run(
            [sys.executable, "-m", "flashcheck", "replay", str(repro), "--no-snippet"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        assert res.returncode == 1, (f["id"], f["message"], res.stdout[-2000:], res.stderr[-2000:])
