"""The numbers a campaign prints and records: the step budget and what the progress line says remains of it, the
first-seen step of a finding, the state of a worker the campaign stopped, and the checks a run lists as run.

The supervisor-level tests drive a `Supervisor` over a real run directory with stand-in worker handles (no worker
process starts); the end-to-end ones run tiny CPU campaigns with a step budget, so no assertion depends on timing.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from crashy import SMALL

from flashcheck.campaign.corpus import Corpus, open_database
from flashcheck.campaign.options import CampaignConfig
from flashcheck.campaign.progress import Progress
from flashcheck.campaign.store import CampaignStore
from flashcheck.campaign.supervisor import Job, Supervisor, _Handle
from flashcheck.cli import EXIT_INCOMPLETE, main
from flashcheck.findings import Finding, Location
from flashcheck.fuzzing.scenarios import random_steps
from flashcheck.scenario import Scenario
from flashcheck.targets.reference import ReferenceTarget
from tests.campaign.conftest import findings_of, read_json


def supervisor(tmp_path: Path, **cfg: Any) -> Supervisor:
    out = tmp_path / "run"
    config = CampaignConfig(targets=("cpu-reference",), **cfg)
    store = CampaignStore.create(out, {"kind": "campaign", "campaign": {"config": config.to_dict(), "workers": {}}})
    return Supervisor(config, store, Corpus(open_database(None, out)), Progress(io.StringIO(), tty=False))


def handle(sup: Supervisor, w: int, job: Job | None = None, executed: int = 0) -> _Handle:
    """A worker slot in the supervisor's books, without a process behind it."""
    proc: Any = SimpleNamespace(returncode=None, stdin=io.StringIO(), wait=lambda timeout=None: None, kill=lambda: None)
    h = _Handle(w, 0, proc, io.BytesIO())
    h.status, h.job, h.executed = ("busy" if job else "idle"), job, executed
    sup.handles[w] = h
    return h


def test_steps_a_busy_worker_ran_count_against_the_budget(tmp_path: Path) -> None:
    """60 steps: 40 done in complete chunks, a chunk of 10 in flight with 3 of them run. 10 steps remain to hand
    out (not 13: handing out 13 ran the campaign 3 steps past its budget), and the progress line says 17 steps
    remain of what the 43 it counts as run leave."""
    sup = supervisor(tmp_path, step_budget=60, chunk_steps=10, workers=2)
    sup.store.worker(0).steps_done, sup.store.worker(1).steps_done = 20, 20
    handle(sup, 0, Job("chunk:2", "chunk", "cpu-reference", 10, chunk=2), executed=3)
    handle(sup, 1)
    assert sup._steps_left() == 10
    job = sup._next_job(1)
    assert job is not None and job.n == 10
    assert sup._remaining_text().startswith("17 steps") and sup._snapshot().steps == 43
    sup.store.close()


def test_a_corpus_replay_longer_than_what_remains_of_the_budget_waits(tmp_path: Path) -> None:
    sup = supervisor(tmp_path, step_budget=5, chunk_steps=10)
    tgt = ReferenceTarget(**json.loads(SMALL))
    sup.pending_corpus.append(("c1", Scenario("cpu-reference", tuple(random_steps(tgt.capacity, 8, 1)), 1, {})))
    handle(sup, 0)
    job = sup._next_job(0)
    assert job is not None and job.kind == "chunk" and job.n == 5  # not the 8-step replay
    assert "c1" not in sup.store.corpus_done  # a resumed campaign with more budget replays it whole
    sup.store.close()


def _campaign(out: Path, *args: str) -> int:
    return main(
        ["campaign", "--target-config", SMALL, "--layers", "off", "--log-every", "0.01", "--out", str(out), *args]
    )


def test_a_two_worker_campaign_runs_its_step_budget_and_no_more(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    rc = _campaign(out, "--target", "cpu-reference", "--workers", "2", "--steps", "30", "--chunk-steps", "3")
    # chunks of 3 steps only capture (every bucket is captured first): nothing replays or runs eagerly, so the
    # properties of outputs and replays were never exercised and the campaign is not clean
    assert rc == EXIT_INCOMPLETE
    meta = read_json(out / "run.json")
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert meta["stats"]["steps"] == 30 and len(samples) == 30, (meta["stats"], Counter(s["worker"] for s in samples))
    for line in capsys.readouterr().out.splitlines():
        if line.startswith("[campaign] elapsed"):
            steps = int(line.split("| steps ")[1].split()[0])
            remaining = int(line.split(" remaining ")[1].split()[0])
            assert steps <= 30 and remaining == 30 - steps, line


def test_a_crash_counts_the_step_it_happened_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One worker, one chunk: the campaign-wide count at a finding of scenario step i is i + 1, for the step a
    worker died in as for a step that reported a finding (the crash was read as i, so one at step 0 read 0)."""
    monkeypatch.setenv("CRASHY_MARKER", str(tmp_path / "crashed"))
    out = tmp_path / "run"
    assert _campaign(out, "--target", "crashy:ExitOnceOnSixthCall", "--steps", "20", "--chunk-steps", "20") == 1
    meta = read_json(out / "run.json")
    (crash,) = findings_of(out)
    assert crash["id"] == "FC251" and crash["location"]["step"] >= 1, crash["location"]
    first = meta["campaign"]["first_seen"][crash["signature"]]
    assert first["steps"] == crash["location"]["step"] + 1, (first, crash["location"])
    # the step it died in counts as run, as it does in first-seen steps: 19 steps that finished and the crashed one
    assert meta["stats"]["steps"] == 20 and len((out / "samples.jsonl").read_text().splitlines()) == 19


def test_when_a_finding_was_first_seen_survives_a_kill_before_the_next_save(tmp_path: Path) -> None:
    """kill -9 between a new finding and the next save of run.json: the resumed campaign has the finding (it is in
    findings.json) and must still know when it was first seen; a re-run finds it again only as a duplicate."""
    sup = supervisor(tmp_path)
    store, out = sup.store, sup.store.dir
    f = Finding(id="FC301", name="csr-well-formed", kind="property", message="m", location=Location(target="t"))
    steps = random_steps(ReferenceTarget(**json.loads(SMALL)).capacity, 3, 1)
    repro = {"scenario": Scenario("cpu-reference", tuple(steps), 1, {}).to_dict()}
    assert store.add_finding(f, repro, steps=7) == "new"
    store.writer._samples.close()  # what a kill -9 leaves: no close(), no save() after the finding
    store.lock.release()
    again = CampaignStore.resume(out)
    assert again.add_finding(f, repro, steps=50) == "duplicate"
    assert again.first_seen[f.signature()]["steps"] == 7
    again.close()


def test_a_worker_the_campaign_killed_at_its_stop_deadline_reads_stopped_and_a_crash_dead(tmp_path: Path) -> None:
    """The budget is spent while a worker is in a long step (a JIT compile): the supervisor asks it to stop, then
    kills it past the stop deadline. That worker was stopped, not dead; one that crashes on its own while the
    campaign stops is dead."""
    sup = supervisor(tmp_path, workers=2)
    slow = handle(sup, 0, Job("chunk:0", "chunk", "cpu-reference", 10, chunk=0), executed=4)
    crashed = handle(sup, 1, Job("chunk:0", "chunk", "cpu-reference", 10, chunk=0), executed=2)
    for h in (slow, crashed):
        h.began = True
    sup._stop("time budget spent")
    killed: list[int] = []
    slow.proc.kill = lambda: killed.append(0)  # type: ignore[method-assign]
    crashed.proc.returncode = -11  # SIGSEGV, before the deadline
    sup._on_exit(crashed)
    sup._stop_deadline = 0.0  # the deadline has passed
    sup._check_timeouts()
    assert killed, "the supervisor kills a worker still busy past the stop deadline"
    slow.proc.returncode = -9
    sup._on_exit(slow)
    assert (slow.status, crashed.status) == ("stopped", "dead")
    line = Progress(io.StringIO(), tty=False)._line(sup._snapshot())
    assert "w0=0.0/s(stopped)" in line and "w1=0.0/s(dead)" in line, line
    sup.store.close()


def test_a_clean_campaign_lists_the_checks_it_reported_and_junit_passes_those(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--select narrows what a campaign reports: run.json lists those checks (and FC251, always reported) as the
    checks run, not every check the workers ran whose findings the supervisor dropped."""
    import xml.etree.ElementTree as ET

    out = tmp_path / "run"
    # 12 steps: the 4 buckets are captured, then replays and eager steps compare outputs (FC303)
    assert _campaign(out, "--target", "cpu-reference", "--select", "FC301,FC303", "--steps", "12") == 0
    assert read_json(out / "run.json")["checks"] == ["FC251", "FC301", "FC303"]
    capsys.readouterr()
    assert main(["report", str(out), "--no-color"]) == 0
    assert capsys.readouterr().out.strip().endswith("checks run and passed: FC251, FC301, FC303")
    assert main(["report", str(out), "--format", "junit"]) == 0
    suite = ET.fromstring(capsys.readouterr().out)
    names = [str(c.get("name")).split()[0] for c in suite.iter("testcase")]
    assert names == ["FC251", "FC301", "FC303"] and suite.get("tests") == "3" and suite.get("failures") == "0"


def test_a_campaign_that_never_reaches_a_selected_check_is_incomplete_and_never_passes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """4 steps capture the 4 buckets and nothing more: no output is ever compared, so FC303 was selected and not
    exercised. The campaign, the report and JUnit say so; FC301 (checked on every capture) passes."""
    import xml.etree.ElementTree as ET

    out = tmp_path / "run"
    assert _campaign(out, "--target", "cpu-reference", "--select", "FC301,FC303", "--steps", "4") == EXIT_INCOMPLETE
    record = read_json(out / "run.json")["checks_by_target"]["cpu-reference"]
    assert {"FC251", "FC301"} <= set(record["exercised"]) and "FC303" not in record["exercised"]
    capsys.readouterr()
    assert main(["report", str(out), "--no-color"]) == EXIT_INCOMPLETE
    text = capsys.readouterr().out
    assert "not exercised: FC303" in text and "passed: FC251, FC301" not in text.splitlines()[-1]
    assert main(["report", str(out), "--format", "junit"]) == EXIT_INCOMPLETE
    cases = {str(c.get("name")).split()[0]: c for c in ET.fromstring(capsys.readouterr().out).iter("testcase")}
    skipped = cases["FC303"].find("skipped")
    assert skipped is not None and skipped.get("message") == "not exercised"
    assert cases["FC301"].find("skipped") is None and cases["FC301"].find("failure") is None


def test_a_resumed_campaign_lasts_the_time_its_sessions_ran(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An hour between two sessions (run.json's start moved an hour back) is not campaign time: the elapsed time,
    every report's duration and the summary add up the sessions alone."""
    out = tmp_path / "run"
    assert _campaign(out, "--target", "cpu-reference", "--steps", "12") == 0
    meta = read_json(out / "run.json")
    first = meta["stats"]["elapsed_s"]
    meta["started"] -= 3600.0
    (out / "run.json").write_text(json.dumps(meta))
    assert main(["campaign", "--resume", str(out), "--steps", "24", "--log-every", "3600"]) == 0
    meta = read_json(out / "run.json")
    elapsed = meta["stats"]["elapsed_s"]
    assert meta["campaign"]["sessions"] == 2 and first < elapsed < 600 < meta["finished"] - meta["started"]
    capsys.readouterr()
    assert main(["report", str(out), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["run"]["duration_s"] == elapsed
    assert main(["report", str(out), "--format", "junit"]) == 0
    assert f'time="{elapsed:.3f}"' in capsys.readouterr().out
