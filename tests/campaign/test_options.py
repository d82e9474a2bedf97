"""Pure pieces of campaigns: budgets, node sharding, seeds, the ledger, the store's smallest-reproducer rule."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from flashcheck.campaign.checks import crash_cause
from flashcheck.campaign.ledger import load_ledger, scenario_sha
from flashcheck.campaign.options import chunk_seed, parse_duration, parse_workers, resolve_node
from flashcheck.campaign.progress import Progress, Snapshot, WorkerLine
from flashcheck.campaign.store import CampaignStore
from flashcheck.errors import InvalidArgument
from flashcheck.findings import Finding, Location
from flashcheck.scenario import Scenario, Step


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("10m", 600), ("8h", 28800), ("1h30m", 5400), ("2h15m10s", 8110), ("300", 300), ("1.5m", 90)],
)
def test_durations_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "10", "abc", "10x", "30m1h", "1h1h", "m", "0s", "-5m", "1h 30m"])
def test_bad_durations_say_how_to_write_them(text: str) -> None:
    if text == "10":
        assert parse_duration(text) == 10
        return
    with pytest.raises(InvalidArgument, match="--time"):
        parse_duration(text)


def test_workers_auto_is_one_per_gpu_or_one_on_cpu() -> None:
    assert parse_workers("auto", 0) == 1
    assert parse_workers("auto", 8) == 8
    assert parse_workers("3", 0) == 3
    with pytest.raises(InvalidArgument, match="--workers"):
        parse_workers("many", 0)


def test_node_index_from_flags_slurm_and_kubernetes() -> None:
    assert resolve_node(None, None, {}) == (0, 1)
    assert resolve_node(2, 4, {}) == (2, 4)
    assert resolve_node(
        None, None, {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "4", "SLURM_ARRAY_TASK_COUNT": "3"}
    ) == (1, 3)
    assert resolve_node(None, 8, {"JOB_COMPLETION_INDEX": "7"}) == (7, 8)
    assert resolve_node(None, None, {"JOB_COMPLETION_INDEX": "3", "FLASHCHECK_NUM_NODES": "4"}) == (3, 4)
    with pytest.raises(InvalidArgument, match="node index 4"):
        resolve_node(4, 4, {})


def test_seed_streams_are_disjoint_across_nodes_workers_and_chunks() -> None:
    seeds = {chunk_seed(7, n, w, k) for n in range(4) for w in range(4) for k in range(50)}
    assert len(seeds) == 4 * 4 * 50
    assert chunk_seed(7, 1, 2, 3) == chunk_seed(7, 1, 2, 3)


def test_crash_cause_names_signals_and_exit_codes() -> None:
    assert crash_cause(-9, False) == "signal SIGKILL"
    assert crash_cause(3, False) == "exit 3"
    assert crash_cause(-9, True) == "hang"


def _scenario(n: int = 2) -> Scenario:
    return Scenario("cpu-reference", tuple(Step("replay", (1, 1, 1), (3, 9, 4)) for _ in range(n)), seed=1)


def test_ledger_entries_must_cite_a_reason(tmp_path: Path) -> None:
    p = tmp_path / "l.json"
    p.write_text(json.dumps({"quarantine": [{"target": "cpu-reference", "step": {"batch_size": 3}}]}))
    with pytest.raises(InvalidArgument, match="no reason"):
        load_ledger(p)
    p.write_text(json.dumps([{"target": "x", "reason": "r", "step": {"colour": 1}}]))
    with pytest.raises(InvalidArgument, match="may only match"):
        load_ledger(p)
    p.write_text("{not json")
    with pytest.raises(InvalidArgument, match="not valid JSON"):
        load_ledger(p)


def test_ledger_skips_steps_and_scenarios(tmp_path: Path) -> None:
    scen = _scenario()
    p = tmp_path / "l.toml"
    p.write_text(
        '[[quarantine]]\ntarget = "cpu-*"\nreason = "flashinfer#1"\nstep = { op = "replay", '
        'qo_lens = [1, 1, 1] }\n\n[[quarantine]]\ntarget = "*"\nreason = "known"\n'
        f'scenario = "{scenario_sha(scen)}"\n'
    )
    ledger = load_ledger(p)
    filtered, reasons = ledger.filter_steps(scen)
    assert filtered.steps == () and reasons == ["flashinfer#1", "flashinfer#1"]
    assert ledger.skip_scenario(scen) is not None and ledger.skip_scenario(_scenario(1)) is None
    other = Scenario("decode-tc", scen.steps)
    assert ledger.filter_steps(other)[1] == []


def _finding() -> Finding:
    return Finding(
        "FC251", "worker-crashed", "runtime", "died", location=Location(target="t"), evidence={"check": "exit 3"}
    )


def _repro(scen: Scenario) -> dict[str, object]:
    return {"schema": 1, "scenario": scen.to_dict(), "step": len(scen.steps) - 1}


def test_store_keeps_the_smallest_reproducer_and_survives_a_resume(tmp_path: Path) -> None:
    meta = {"kind": "campaign", "campaign": {"config": {"targets": ["t"]}, "workers": {}}}
    store = CampaignStore.create(tmp_path / "run", meta)
    f = _finding()
    assert store.add_finding(f, _repro(_scenario(5))) == "new"
    assert store.add_finding(f, _repro(_scenario(3))) == "smaller"
    assert store.add_finding(f, _repro(_scenario(4))) == "duplicate"
    small = Scenario("cpu-reference", (Step("eager", (1,), (1,)),) * 3)
    assert store.add_finding(f, _repro(small)) == "smaller"  # same steps, fewer tokens
    store.close()
    repro = json.loads((tmp_path / "run" / "repros" / f"{f.signature()}.json").read_text())
    assert len(repro["scenario"]["steps"]) == 3 and repro["scenario"]["steps"][0]["op"] == "eager"
    again = CampaignStore.resume(tmp_path / "run")
    assert again.add_finding(f, _repro(_scenario(3))) == "duplicate"
    assert len(again.findings) == 1
    again.close()


def test_progress_redraws_on_a_terminal_and_logs_lines_otherwise() -> None:
    snap = Snapshot(
        12.0, "1m00s", 40, [WorkerLine(0, "busy", 40, 3.3, "cpu-reference chunk:1")], {"FC301": 2}, 7, 1, 1, 2
    )
    plain = io.StringIO()
    Progress(plain, tty=False).update(snap, force=True)
    assert plain.getvalue().startswith("[campaign] elapsed 12s remaining 1m00s | steps 40 | w0=3.3/s(busy)")
    assert "findings FC301×2 | shapes 7" in plain.getvalue() and "\x1b[" not in plain.getvalue()
    tty = io.StringIO()
    p = Progress(tty, tty=True)
    p.update(snap, force=True)
    p.update(snap, force=True)
    assert "\x1b[3F\x1b[J" in tty.getvalue() and "worker 0" in tty.getvalue()
