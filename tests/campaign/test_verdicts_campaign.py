"""One campaign over faulty targets of every verdict family and a clean control (CPU analogs of the GPU evidence):
it runs its whole budget, finds each faulty target by its intended check, finds nothing in the clean one, drops no
target as unavailable, and every reproducer replays to the same finding: `flashcheck replay` (run in-process here)
replays the faults and the hang in a fresh worker process, the rest in a fresh session. tests/fuzz/test_repro_replay.py
runs `flashcheck replay` end to end in a fresh process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flashcheck.cli import main
from tests.campaign.conftest import findings_of, read_json

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
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(QUALITY))
    out = tmp_path / "run"
    targets = [*FAULTY, "cpu-reference"]
    # one 20-step chunk of each target: a faulty one's chunk and the continuation of its rest in a fresh worker take
    # at most 20 steps between them, so the clean control, last, gets its full chunk (asserted below)
    steps = 20 * len(targets) - 20
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
            str(steps),
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
    assert meta["stats"]["steps"] >= steps - len(targets)  # the whole budget (hung steps are not counted as run)
    assert meta["campaign"]["dropped_targets"] == {}, "no target may be dropped as unavailable"
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
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert sum(s["target"] == "cpu-reference" for s in samples) == 20, "the clean control ran one whole chunk"
    for f in found:
        rc = main(["replay", str(out / f["repro"]), "--no-snippet"])
        assert rc == 1, (f["id"], f["message"], capsys.readouterr().out[-2000:])
