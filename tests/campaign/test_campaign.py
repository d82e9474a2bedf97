"""End-to-end campaigns on CPU with real worker processes: injected crashes, a hang, a supervisor killed with
``kill -9`` and resumed, two nodes sharing one corpus, and the errors bad input gets.

No assertion depends on timing beyond a worker starting within seconds: every run is seeded and bounded by a step
budget, except the one about a time budget that ends while a step hangs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from crashy import SMALL

from flashcheck.campaign.corpus import Corpus, open_database
from flashcheck.cli import main
from flashcheck.scenario import Scenario
from tests.campaign.conftest import findings_of, read_json, subprocess_env, worker_cmd


def campaign(*args: str) -> int:
    return main(["campaign", "--target-config", SMALL, "--layers", "off", "--log-every", "3600", *args])


def checks(run_dir: Path, id_: str = "FC251") -> Counter[str]:
    return Counter(f["evidence"]["check"] for f in findings_of(run_dir) if f["id"] == id_)


@pytest.mark.slow
def test_every_injected_crash_is_one_finding_with_a_working_reproducer(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert (
        campaign(
            "--target", "crashy:CrashTwoWays", "--steps", "125", "--chunk-steps", "25", "--seed", "3", "--out", str(out)
        )
        == 1
    )
    meta = read_json(out / "run.json")
    assert meta["stats"]["steps"] == 125  # the campaign carried on through every crash (three, of two kinds)
    assert meta["stats"]["crashes"] >= 2 and meta["stats"]["restarts"] == meta["stats"]["crashes"]
    assert checks(out) == {"exit 3": 1, "signal SIGKILL": 1}  # two injected crashes, one finding each
    for f in findings_of(out):
        repro = read_json(out / f["repro"])
        assert repro["step"] == len(repro["scenario"]["steps"]) - 1
        # the reproducer crashes a fresh process exactly the way the worker died
        rc = subprocess.run(
            worker_cmd("repro", str(out / f["repro"])), env=subprocess_env(), capture_output=True, check=False
        ).returncode
        assert rc == f["evidence"]["returncode"], f["evidence"]
        assert f["evidence"]["quarantine"]["step"]["batch_size"] in (3, 5)


@pytest.mark.slow
def test_a_hung_worker_is_reported_once_with_its_stacks(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert (
        campaign(
            "--target",
            "crashy:HangOnShape",
            "--steps",
            "60",
            "--chunk-steps",
            "20",
            "--seed",
            "4",
            "--step-timeout",
            "5s",  # the worker's watchdog at 3 s: far above a step's cost, with other tests running beside it
            "--layers",
            "cheap",  # (not "off"): the run names the layers its workers ran and skipped
            "--out",
            str(out),
        )
        == 1
    )
    assert checks(out, "FC252") == {"hang": 1} and checks(out) == {}
    (f,) = findings_of(out)
    assert "crashy.py" in f["evidence"]["threads"] and "time.sleep" not in f["message"]
    assert f["location"]["target"] == "crashy-hang"  # the target's name, as its other findings use
    meta = read_json(out / "run.json")
    assert meta["stats"]["steps"] == 60
    # the workers' detection layers reach the run's environment (CPU: the CUDA layers skipped, with why)
    assert "graph_replay" in meta["environment"]["detection layers"]
    assert "sync_debug: no CUDA device" in meta["environment"]["layers skipped"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("target", "hangs"),
    [("crashy:SlowFirstCapture", False), ("crashy:SlowSecondCapture", True), ("crashy:SlowSetup", False)],
)
def test_the_first_step_of_its_kind_in_a_worker_gets_the_warm_up_leash(
    tmp_path: Path, target: str, hangs: bool
) -> None:
    """A first-use JIT compile longer than the step timeout is not a hang (the worker and the supervisor both give
    a process's first step of each kind, and the set-up of its session, `--warm-up-scale` timeouts); the same delay
    in a later step is one."""
    out = tmp_path / "run"
    rc = campaign(
        "--target",
        target,
        "--steps",
        "3",  # three captures: a worker's first, its second and (SlowSecondCapture) the first of its replacement
        "--chunk-steps",
        "3",
        "--seed",
        "4",
        "--step-timeout",
        "2s",  # see crashy.SLOW_SECONDS
        "--warm-up-scale",
        "3",
        "--out",
        str(out),
    )
    hung = [f for f in findings_of(out) if f["id"] in ("FC251", "FC252")]
    if hangs:
        assert rc == 1 and [f["id"] for f in hung][:1] == ["FC252"]
        assert all(f["location"]["step_name"].startswith("capture") for f in hung)
    else:
        assert hung == [] and rc in (0, 4)  # 4: six steps may not reach a replay (a check not exercised)


@pytest.mark.slow
def test_a_step_hung_on_its_warm_up_leash_when_the_time_budget_ends_is_judged(tmp_path: Path) -> None:
    """When the time budget ends while a worker's first capture has outlasted the step timeout (a kernel that never
    ends, on the longer leash a first-use compile gets), the campaign waits for the step's leash instead of killing
    the worker unjudged at the stop deadline: the hang is a finding. Needs the worker to reach its first step within
    the 10 s budget; the hang is judged about 16 s after that step began (watchdog 12 s plus its grace)."""
    out = tmp_path / "run"
    rc = campaign(
        "--target", "crashy:HangEveryCapture", "--time", "10s", "--chunk-steps", "5", "--seed", "4",
        "--step-timeout", "2s", "--warm-up-scale", "10", "--out", str(out),
    )  # fmt: skip
    hung = [f for f in findings_of(out) if f["id"] in ("FC251", "FC252")]
    assert rc == 1 and len(hung) == 1, (rc, hung)
    assert hung[0]["location"]["step_name"].startswith("capture") and hung[0]["location"]["step"] == 0


@pytest.mark.slow
def test_a_ledger_quarantines_the_crasher_before_launch(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.json"
    ledger.write_text(
        json.dumps(
            {
                "quarantine": [
                    {"target": "crashy:*", "step": {"batch_size": 3}, "reason": "test: exit_shape crashes (crashy.py)"}
                ]
            }
        )
    )
    out = tmp_path / "run"
    assert (
        campaign(
            "--target",
            "crashy:ExitOnShape",
            "--steps",
            "100",
            "--chunk-steps",
            "25",
            "--seed",
            "3",
            "--ledger",
            str(ledger),
            "--out",
            str(out),
        )
        == 0
    )
    meta = read_json(out / "run.json")
    assert findings_of(out) == [] and meta["stats"]["crashes"] == 0
    assert meta["campaign"]["skipped_steps"] > 0


def _wait_for(pred: object, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 300  # a liveness guard only; nothing asserts on durations
    while not pred():  # type: ignore[operator]
        assert proc.poll() is None, f"the campaign ended before {what}"
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.2)


@pytest.mark.slow
def test_kill_9_of_the_whole_campaign_then_resume_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "flashcheck",
        "campaign",
        "--target",
        "crashy:Mixed",
        "--target-config",
        SMALL,
        "--layers",
        "off",
        "--steps",
        "120",  # four crashes, on both sides of the kill
        "--chunk-steps",
        "10",
        "--seed",
        "5",
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(
        cmd, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )

    def progressed() -> bool:
        try:
            meta = read_json(out / "run.json")
        except (OSError, ValueError):
            return False
        return meta.get("stats", {}).get("steps", 0) >= 40 and len(findings_of(out)) >= 2

    try:
        _wait_for(progressed, proc, "40 steps and 2 findings")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the supervisor and every worker, mid-run
        proc.wait()
    before = {f["signature"] for f in findings_of(out)}
    steps_before = read_json(out / "run.json")["stats"]["steps"]
    assert 40 <= steps_before < 120

    assert main(["campaign", "--resume", str(out), "--log-every", "3600"]) == 1
    meta = read_json(out / "run.json")
    after = findings_of(out)
    sigs = [f["signature"] for f in after]
    assert len(sigs) == len(set(sigs))  # nothing duplicated
    assert before <= set(sigs)  # nothing lost
    assert all((out / f["repro"]).is_file() for f in after)
    assert meta["stats"]["steps"] == 120 and meta["campaign"]["sessions"] == 2
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    keys = [(s["worker"], s["step"]) for s in samples]
    assert len(keys) == len(set(keys)) and all(s["step"] < 120 for s in samples)
    assert {"FC251", "FC301"} <= {f["id"] for f in after}


@pytest.mark.slow
def test_two_nodes_share_one_corpus_directory(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    runs = [tmp_path / "node0", tmp_path / "node1"]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "flashcheck",
                "campaign",
                "--target",
                "crashy:Polluting",
                "--target-config",
                SMALL,
                "--layers",
                "off",
                "--steps",
                "40",
                "--chunk-steps",
                "20",
                "--seed",
                "9",
                "--corpus",
                str(corpus),
                "--node-index",
                str(i),
                "--num-nodes",
                "2",
                "--out",
                str(runs[i]),
            ],
            env=subprocess_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for i in range(2)
    ]
    for p in procs:
        _, err = p.communicate()
        assert p.returncode == 1, err.decode()[-2000:]
    # disjoint seed streams: the nodes ran different scenarios
    batches = [
        [
            (d["op"], d["batch_size"], d["total_qo"], d["total_kv"])
            for d in map(json.loads, (r / "samples.jsonl").read_text().splitlines())
        ]
        for r in runs
    ]
    assert batches[0] and batches[1] and batches[0] != batches[1]
    db = Corpus(open_database(str(corpus), tmp_path))
    entries = dict(db.entries("crashy:Polluting"))
    for r in runs:
        for f in findings_of(r):
            scen = Scenario.from_dict(read_json(r / f["repro"])["scenario"])
            assert Corpus.encode(scen) in {Corpus.encode(s) for s in entries.values()}
    # a third node starts later with a budget spent on corpus replays alone: it re-finds what the others found
    late = tmp_path / "late"
    budget = sum(len(s.steps) for s in entries.values())
    assert (
        campaign(
            "--target",
            "crashy:Polluting",
            "--steps",
            str(budget),
            "--seed",
            "1",
            "--corpus",
            str(corpus),
            "--out",
            str(late),
        )
        == 1
    )
    assert set(read_json(late / "run.json")["campaign"]["corpus_done"]) >= set(entries)
    assert {f["signature"] for f in findings_of(late)} >= {f["signature"] for f in findings_of(runs[0])}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "no-such-target", "--steps", "1"], "unknown target 'no-such-target'"),
        (["--target", "nomodule_xyz:Cls", "--steps", "1"], "cannot import module 'nomodule_xyz'"),
        (["--target", "cpu-reference", "--select", "FC301,FC999", "--steps", "1"], "unknown check 'FC999'"),
        (["--target", "cpu-reference", "--time", "ten minutes"], "--time 'ten minutes' does not parse"),
        (["--target", "cpu-reference", "--steps", "1", "--warm-up-scale", "0.5"], "--warm-up-scale must be at least 1"),
        (["--target", "cpu-reference", "--steps", "1", "--out", "{file}/sub"], "cannot be written"),
        (["--resume", "{tmp}/nothing"], "no such directory"),
        (["--resume", "{tmp}"], "no run.json"),
        (["--resume", "{bad}"], "run.json is unreadable"),
        (["--resume", "{static}"], "not a campaign"),
        (["--resume", "{static}", "--target", "cpu-reference"], "drop --target"),
        (["--target", "cpu-reference", "--steps", "1", "--ledger", "{ledger}"], "has no reason"),
        ([], "name a --target"),
    ],
)
def test_bad_input_gets_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    (tmp_path / "file").write_text("")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "run.json").write_text("{cut")
    (tmp_path / "static").mkdir()
    (tmp_path / "static" / "run.json").write_text(json.dumps({"kind": "static", "schema": 1}))
    (tmp_path / "ledger.json").write_text(json.dumps([{"target": "*", "step": {"batch_size": 1}}]))
    subs = {
        "{file}": str(tmp_path / "file"),
        "{tmp}": str(tmp_path),
        "{bad}": str(tmp_path / "bad"),
        "{static}": str(tmp_path / "static"),
        "{ledger}": str(tmp_path / "ledger.json"),
    }
    for k, v in subs.items():
        args = [a.replace(k, v) for a in args]
    assert main(["campaign", *args]) == 2
    assert message in capsys.readouterr().err


def test_supervisor_side_imports_no_torch() -> None:
    code = (
        "import sys, flashcheck.cli, flashcheck.cli.campaign_cmd, flashcheck.campaign.supervisor, "
        "flashcheck.campaign.corpus; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], env=subprocess_env(), check=True)


@pytest.mark.slow
def test_first_seen_counts_the_steps_run_and_a_normal_stop_is_not_a_dead_worker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finding's first-seen step is the campaign-wide count of steps run when it appeared (steps of the chunk in
    flight included, so never 0 for a finding at a step), and workers the campaign stopped read "stopped"."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "quality"))
    out = tmp_path / "run"
    cfg = SMALL if isinstance(SMALL, str) else json.dumps(SMALL)
    args = ["--target", "faulty_targets:PlanInfoVaries", "--config", cfg, "--steps", "40", "--chunk-steps", "40"]
    args += ["--layers", "off"]  # FC304 is a property: no detection layer needed
    rc = main(["campaign", *args, "--seed", "3", "--log-every", "0.01", "--out", str(out)])
    assert rc == 1
    first = read_json(out / "run.json")["campaign"]["first_seen"]
    assert first and all(1 <= v["steps"] <= 40 for v in first.values()), first
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[campaign] elapsed")]
    assert "(dead)" not in lines[-1] and "(stopped)" in lines[-1], lines[-1]
