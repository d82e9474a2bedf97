"""The campaign supervisor: owns the run directory, starts one worker process per slot, hands out scenario
chunks, turns a dead or hung worker into one FC251 finding with its in-flight scenario, restarts it, and stops
on the budget. It imports no torch; workers do.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from flashcheck._spawn import Worker, spawn
from flashcheck.campaign.checks import WORKER_CRASHED, crash_cause, crash_finding, stderr_tail
from flashcheck.campaign.corpus import Corpus
from flashcheck.campaign.ledger import scenario_sha, step_shape
from flashcheck.campaign.options import CampaignConfig, chunk_seed, format_duration
from flashcheck.campaign.progress import Progress, Snapshot, WorkerLine
from flashcheck.campaign.store import CampaignStore
from flashcheck.campaign.worker import HANG_FILE, WATCHDOG_SHARE
from flashcheck.errors import EXIT_CLEAN, EXIT_FINDINGS, EXIT_INTERNAL, EXIT_INTERRUPTED, InvalidArgument
from flashcheck.exercised import Exercised, add_exercised
from flashcheck.findings import Finding
from flashcheck.known import unmatched_entries
from flashcheck.repro import make_repro
from flashcheck.rundir import Sample, add_environment
from flashcheck.scenario import Scenario
from flashcheck.watchdog import hang_finding, read_hang_file

__all__ = ["Outcome", "Supervisor"]

MAX_EARLY_DEATHS = 3  # consecutive deaths before a worker's first step: the worker itself is broken
_EOF = "\x00eof"


@dataclass
class Job:
    id: str
    kind: str  # "chunk" | "corpus"
    target: str
    n: int
    chunk: int | None = None
    corpus_id: str | None = None
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    """How the campaign ended: exit code for the CLI (0 clean, 1 findings, 2 error, 3 environment)."""

    code: int
    reason: str


class _Handle:
    """One live incarnation of a worker slot."""

    def __init__(self, index: int, gen: int, proc: Worker | subprocess.Popen[str], log: IO[bytes]) -> None:
        self.index, self.gen, self.proc, self.log = index, gen, proc, log
        self.status = "starting"
        self.job: Job | None = None
        self.scenario: Scenario | None = None
        self.began, self.executed, self.last_event = False, 0, time.monotonic()
        self.leash = 1.0  # the step in flight may take this many step timeouts (a worker's first of its kind)
        self.hung = self.poisoned = self.asked_to_stop = self.setup_failed = self.stop_killed = False
        self.target_name, self.steps_session = "", 0  # the name findings use (its spec may differ), steps run
        self.window: collections.deque[tuple[float, int]] = collections.deque(maxlen=64)

    def send(self, cmd: dict[str, Any]) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass  # it died; its EOF is on the way

    def rate(self) -> float:
        if len(self.window) < 2:
            return 0.0
        (t0, s0), (t1, s1) = self.window[0], self.window[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0


class Supervisor:
    def __init__(
        self,
        cfg: CampaignConfig,
        store: CampaignStore,
        corpus: Corpus,
        progress: Progress,
        *,
        corpus_poll: float = 30.0,
        save_every: float = 10.0,
    ) -> None:
        self.cfg, self.store, self.corpus, self.progress = cfg, store, corpus, progress
        self.events: queue.Queue[tuple[int, int, str]] = queue.Queue()
        self.handles: dict[int, _Handle] = {}
        self.gens: dict[int, int] = {}
        self.early_deaths: dict[int, int] = {}
        self.pending_corpus: list[tuple[str, Scenario]] = []
        self.pending_rest: list[Scenario] = []  # what workers that faulted, hung or crashed did not get to run
        self._rest_jobs = 0
        self._rest_turn = False
        self.stopping = False
        self.stop_reason = ""
        self.ran_targets: set[str] = set()  # names of the targets set up in this session (for the known ledger)
        self.fatal: Outcome | None = None
        self.corpus_poll, self.save_every = corpus_poll, save_every
        self._stop_deadline: float | None = None

    # ---- workers -----------------------------------------------------------------------------------------------
    def _spawn(self, w: int) -> None:
        gen = self.gens.get(w, -1) + 1
        self.gens[w] = gen
        wdir = self.store.dir / "workers" / str(w)
        wdir.mkdir(parents=True, exist_ok=True)
        (wdir / "inflight.json").unlink(missing_ok=True)
        env = dict(os.environ)
        # like multiprocessing's spawn: the worker sees our sys.path (module:Class targets import the same way)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        if self.cfg.gpus:
            env["CUDA_VISIBLE_DEVICES"] = self.cfg.gpus[w % len(self.cfg.gpus)]
        log = (wdir / "stderr.log").open("ab")
        args = [
            "serve",
            "--run-dir",
            str(self.store.dir),
            "--worker",
            str(w),
            "--config",
            json.dumps(self.cfg.to_dict()),
        ]
        # a session of its own: Ctrl-C reaches the supervisor alone, which stops the workers itself (a worker hit
        # by the terminal's SIGINT would die mid-chunk with a traceback that reads as a failure)
        proc = spawn("flashcheck.campaign.worker", args, env=env, stderr=log, new_session=True)
        h = _Handle(w, gen, proc, log)
        self.handles[w] = h
        threading.Thread(target=self._read, args=(h,), name=f"flashcheck-worker-{w}", daemon=True).start()
        if self.stopping:  # a signal came while it started (the first start waits for the zygote)
            self._ask_to_stop(h)

    def _read(self, h: _Handle) -> None:
        assert h.proc.stdout is not None
        for line in h.proc.stdout:
            self.events.put((h.index, h.gen, line))
        self.events.put((h.index, h.gen, _EOF))

    # ---- the budget ----------------------------------------------------------------------------------------------
    def _in_flight(self) -> int:
        """Steps handed out in jobs not yet complete, run or not: `store.steps_done()` counts complete jobs only,
        so the steps a busy worker already ran belong here too (leaving them out overran the step budget by them)."""
        return sum(h.job.n for h in self.handles.values() if h.job is not None)

    def _steps_left(self) -> int | None:
        """Steps of the budget not yet handed out to any worker."""
        if self.cfg.step_budget is None:
            return None
        return self.cfg.step_budget - self.store.steps_done() - self._in_flight()

    def _time_left(self) -> float | None:
        return None if self.cfg.time_budget is None else self.cfg.time_budget - self.store.elapsed()

    def _remaining_text(self) -> str:
        t = self._time_left()
        if t is not None:
            return format_duration(t)
        done = self.store.steps_done() + sum(h.executed for h in self.handles.values() if h.job is not None)
        left = max(0, (self.cfg.step_budget or 0) - done)  # the same count the progress line shows as "steps"
        rate = sum(h.rate() for h in self.handles.values())
        return f"{left} steps" + (f" (~{format_duration(left / rate)})" if rate > 0 else "")

    def _targets(self) -> list[str]:
        return [t for t in self.cfg.targets if t not in self.store.dropped]

    def _next_job(self, w: int) -> Job | None:
        left = self._steps_left()
        if left is not None and left <= 0:
            return None
        busy = {h.job.corpus_id for h in self.handles.values() if h.job is not None and h.job.corpus_id}
        targets = self._targets()
        self._rest_turn = not self._rest_turn
        while self.pending_rest and self._rest_turn:
            rest = self.pending_rest.pop(0)
            if rest.target not in targets:
                continue
            n = len(rest.steps) if left is None else min(len(rest.steps), left)
            rest = Scenario(rest.target, rest.steps[:n], rest.seed, rest.target_config)
            self._rest_jobs += 1
            return Job(f"rest:{self._rest_jobs}", "corpus", rest.target, n, payload={"scenario": rest.to_dict()})
        while self.pending_corpus:
            cid, scen = self.pending_corpus.pop(0)
            if cid in self.store.corpus_done or cid in busy or scen.target not in targets:
                continue
            if left is not None and len(scen.steps) > left:
                continue  # a replay runs whole or not at all: past the budget it waits for a resume with more
            payload = {"scenario": scen.to_dict()}
            return Job(f"corpus:{cid}", "corpus", scen.target, len(scen.steps), corpus_id=cid, payload=payload)
        if not targets:
            return None
        ws = self.store.worker(w)
        k = ws.next_chunk
        n = self.cfg.chunk_steps if left is None else min(self.cfg.chunk_steps, left)
        seed = chunk_seed(self.cfg.seed, self.cfg.node_index, w, k)
        target = targets[k % len(targets)]
        return Job(f"chunk:{k}", "chunk", target, n, chunk=k, payload={"target": target, "seed": seed, "n": n})

    def _assign(self) -> None:
        for h in self.handles.values():
            if h.status != "idle" or self.stopping:
                continue
            job = self._next_job(h.index)
            if job is None:
                continue
            h.job, h.scenario, h.began, h.executed, h.status = job, None, False, 0, "busy"
            h.target_name = ""
            h.last_event = time.monotonic()
            h.send({"cmd": "run", "job": job.id, "kind": job.kind, **job.payload})

    def _poll_corpus(self) -> None:
        queued = {cid for cid, _ in self.pending_corpus}
        for target in self._targets():
            for cid, scen in self.corpus.entries(target):
                if cid not in self.store.corpus_done and cid not in queued:
                    self.pending_corpus.append((cid, scen))

    # ---- events ------------------------------------------------------------------------------------------------
    def _handle_event(self, w: int, gen: int, line: str) -> None:
        h = self.handles.get(w)
        if h is None or h.gen != gen:
            return  # a previous incarnation's leftovers
        if line == _EOF:
            self._on_exit(h)
            return
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            return
        h.last_event = time.monotonic()
        kind = ev.get("ev")
        if kind == "ready":
            h.status = "idle"
            if isinstance(ev.get("environment"), dict):
                self.store.meta.setdefault("environment", {}).update(ev["environment"])
        elif kind == "begin":
            h.began = True
            h.scenario = self._inflight(h)
        elif kind == "leash":
            h.leash = float(ev.get("scale", 1.0))
        elif kind == "step":
            h.leash = 1.0
            self._on_step(h, ev)
        elif kind == "skipped":
            self.store.skipped_steps += int(ev.get("steps", 0))
        elif kind == "target":  # set up: the environment now names the backend it loaded (FlashInfer's version)
            h.leash = 1.0  # the set-up's leash ends here
            h.target_name = str(ev.get("name") or "")
            self.ran_targets.add(h.target_name)
            if isinstance(ev.get("environment"), dict):
                add_environment(self.store.meta.setdefault("environment", {}), ev["environment"])
            add_exercised(self.store.meta, {h.target_name: Exercised({WORKER_CRASHED.id})})  # we watch it from here
        elif kind == "exercised":  # what the worker's session exercised of the checks (flashcheck.exercised)
            add_exercised(self.store.meta, {str(ev.get("name")): Exercised.from_dict(ev.get("checks"))})
        elif kind == "poisoned":
            h.poisoned = True
            h.setup_failed = bool(ev.get("setup"))
        elif kind == "env":
            self._on_env(str(ev.get("target")), str(ev.get("reason")))
        elif kind == "done":
            self._complete(h)
            h.status = "idle"
        elif kind == "error":
            msg = f"worker {w} failed: {ev.get('message', '')}"
            self.store.error(msg)
            self.fatal = Outcome(EXIT_INTERNAL, msg)
            self._stop("worker error")

    def _ledger_news(self) -> None:
        """Known-behaviour entries that applied to the targets run here but matched nothing: recorded in run.json
        (``known_unmatched``) and shown in the summary, since the upstream behaviour may have changed."""
        hits = self.store.meta.get("known_upstream", {})
        version = str(self.store.meta.get("environment", {}).get("flashinfer", ""))
        news = unmatched_entries(hits, sorted(self.ran_targets), version)
        self.store.meta["known_unmatched"] = {e.key: e.reason for e in news}

    def _inflight(self, h: _Handle) -> Scenario | None:
        """The scenario the worker wrote before running it (the source of truth after a crash)."""
        try:
            doc = json.loads((self.store.dir / "workers" / str(h.index) / "inflight.json").read_text("utf-8"))
        except (OSError, json.JSONDecodeError):
            return h.scenario
        if h.job is None or doc.get("job") != h.job.id:
            return h.scenario
        return Scenario.from_dict(doc["scenario"])

    def _on_step(self, h: _Handle, ev: dict[str, Any]) -> None:
        ws = self.store.worker(h.index)
        if ev.get("sample"):
            s = Sample.from_dict(ev["sample"])
            self.store.add_sample(
                dataclasses.replace(s, step=ws.steps_done + h.executed, t=self.store.elapsed(), worker=h.index)
            )
        h.executed += 1
        h.steps_session += 1
        if ev.get("known"):
            known = self.store.meta.setdefault("known_upstream", {})
            for k in ev["known"]:
                known[k] = known.get(k, 0) + 1
        h.window.append((time.monotonic(), h.steps_session))
        self.early_deaths[h.index] = 0
        scen = h.scenario
        for d in ev.get("findings", []):
            f = Finding.from_dict(d)
            if self.cfg.select and f.id not in self.cfg.select and f.id != WORKER_CRASHED.id:
                continue
            if scen is not None:
                self._record(f, scen, int(ev.get("i", 0)))

    def _record(self, f: Finding, scen: Scenario, step: int) -> None:
        """Store `f`, found at `step` of `scen`; first seen after every step run so far, campaign-wide (its own
        step included)."""
        repro = make_repro(scen, step, f, layers=self.cfg.layers, async_pressure_us=self.cfg.async_pressure_us)
        repro["command"] = "flashcheck replay REPRO.json"
        now = self.store.steps_done() + sum(x.executed for x in self.handles.values() if x.job is not None)
        result = self.store.add_finding(f, repro, steps=now)
        if result == "duplicate":
            return
        trimmed = Scenario.from_dict(repro["scenario"])
        with contextlib.suppress(Exception):  # a flaky shared corpus must not stop the campaign
            self.store.corpus_done.add(self.corpus.save(trimmed))
        if result == "new":
            self.progress.note(f"new finding {f.id} {f.name} ({f.location}): {f.message[:160]}")

    def _on_env(self, target: str, reason: str) -> None:
        if target in self.store.dropped:
            return
        self.store.dropped[target] = reason
        self.progress.note(f"target {target} cannot run here, dropped: {reason}")
        if not self._targets():
            self.fatal = Outcome(3, f"no target can run here: {'; '.join(self.store.dropped.values())}")
            self._stop("environment unavailable")

    def _complete(self, h: _Handle) -> None:
        job = h.job
        if job is None:
            return
        ws = self.store.worker(h.index)
        ws.steps_done += h.executed
        if job.chunk is not None:
            ws.next_chunk = max(ws.next_chunk, job.chunk + 1)
        if job.corpus_id is not None:
            self.store.corpus_done.add(job.corpus_id)
        h.job, h.scenario, h.executed, h.began = None, None, 0, False
        self.store.save()

    def _on_exit(self, h: _Handle) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            h.proc.wait(timeout=30)
        rc = h.proc.returncode
        h.log.close()
        # "stopped": ended because the campaign is stopping, cleanly or killed by us when its step outlasted the stop
        # deadline (a long JIT compile); "dead" only for anything else
        h.status = "stopped" if self.stopping and (rc == 0 or h.stop_killed) else "dead"
        ws = self.store.worker(h.index)
        job = h.job
        if job is not None and h.poisoned:
            # the step's finding was reported; a fresh worker runs the rest of the chunk (not after a failed setup,
            # which would fail again at every step)
            if not h.setup_failed:
                self._continue_after(h, h.executed)
            self._complete(h)
        elif job is not None and h.began and (h.hung or not h.asked_to_stop or (rc != 0 and not h.stop_killed)):
            # (also a worker that died on its own while the campaign stopped: its watchdog ended a hung step)
            self._record_crash(h, rc)  # counts the step it died in as executed
            ws.crashes += 1
            self._continue_after(h, h.executed)
            self._complete(h)
        elif h.asked_to_stop:
            h.job = None  # stopped mid-chunk: the chunk is not complete and a resumed campaign re-runs it
        else:
            self.early_deaths[h.index] = self.early_deaths.get(h.index, 0) + 1
            h.job = None
            if self.early_deaths[h.index] >= MAX_EARLY_DEATHS:
                msg = (
                    f"worker {h.index} died {MAX_EARLY_DEATHS} times in a row before running a step (last exit "
                    f"status {rc}); see {self.store.dir}/workers/{h.index}/stderr.log"
                )
                self.store.error(msg)
                self.fatal = Outcome(EXIT_INTERNAL, msg)
                self._stop("worker cannot start")
        if not self.stopping:
            ws.restarts += 1
            self.store.save()
            self._spawn(h.index)

    def _continue_after(self, h: _Handle, first: int) -> None:
        """Queue the steps of `h`'s scenario from `first` on for a fresh worker: a fault, hang or crash ends the
        process, never the run. Replays of buckets the fresh worker has not captured capture them first. A
        continuation that faults again is not continued (a target that faults on most steps would otherwise hold
        the worker in restarts), and continuations alternate with fresh chunks of every target."""
        scen = self._inflight(h)
        if self.stopping or scen is None or first >= len(scen.steps):
            return
        if h.job is not None and h.job.id.startswith("rest:"):
            return
        rest = Scenario(scen.target, scen.steps[first:], scen.seed, scen.target_config)
        self.pending_rest.append(rest)

    def _record_crash(self, h: _Handle, rc: int | None) -> None:
        scen = self._inflight(h)
        if scen is None or not scen.steps:
            return
        i = min(h.executed, len(scen.steps) - 1)
        phase = "step" if h.executed < len(scen.steps) else "teardown"
        if phase == "step":  # the step it died in ran: it counts (first-seen steps, the budget) like any other
            h.executed += 1
        step = scen.steps[i]
        name = f"{step.op} bs={len(step.qo_lens)}" + (f" bucket={step.bucket}" if step.bucket else "")
        hang_file = self.store.dir / "workers" / str(h.index) / HANG_FILE
        dump = read_hang_file(hang_file)
        hang_file.unlink(missing_ok=True)
        if dump is not None:  # the worker's watchdog wrote every thread's stack before it ended the process
            f = hang_finding(
                target=h.target_name or scen.target,
                step=i,
                step_name=name,
                timeout=self.cfg.step_timeout * WATCHDOG_SHARE * h.leash,
                stacks=dump[1],
            )
            self._record(f, scen, i)
            self.progress.note(
                f"worker {h.index}: step {i} ({name}) hung" + ("" if self.stopping else "; restarting it")
            )
            return
        cause = crash_cause(rc, h.hung)
        trimmed = Scenario(scen.target, scen.steps[: i + 1], scen.seed, scen.target_config)
        evidence = {
            "returncode": rc,
            "phase": phase,
            "worker": h.index,
            "job": h.job.id if h.job else None,
            "scenario_sha": scenario_sha(trimmed),
            "stderr_tail": stderr_tail(self.store.dir / "workers" / str(h.index) / "stderr.log"),
            "quarantine": {"target": scen.target, "step": step_shape(step), "reason": "<cite the issue>"},
        }
        f = crash_finding(
            target=h.target_name or scen.target,
            step_index=i,
            step_name=name,
            op=step.op,
            cause=cause,
            evidence=evidence,
            timeout=self.cfg.step_timeout * h.leash,
        )
        self._record(f, scen, i)
        again = "" if self.stopping else "; restarting it"
        self.progress.note(f"worker {h.index} {cause} at step {i} ({name}) of {h.job.id if h.job else '?'}{again}")

    # ---- control -----------------------------------------------------------------------------------------------
    def _stop(self, reason: str) -> None:
        if self.stopping:
            return
        self.stopping, self.stop_reason = True, reason
        self._stop_deadline = time.monotonic() + min(60.0, self.cfg.step_timeout)
        for h in self.handles.values():
            self._ask_to_stop(h)

    @staticmethod
    def _ask_to_stop(h: _Handle) -> None:
        h.asked_to_stop = True
        h.send({"cmd": "stop"})
        with contextlib.suppress(OSError, ValueError):
            if h.proc.stdin is not None:
                h.proc.stdin.close()

    def _check_timeouts(self) -> None:
        now = time.monotonic()
        for h in self.handles.values():
            if h.status in ("dead", "stopped") or h.hung:
                continue
            if h.status == "busy" and now - h.last_event > self.cfg.step_timeout * h.leash:
                h.hung = True
                h.proc.kill()
            elif self._stop_deadline is not None and now > self._stop_deadline and not self._judge_at_stop(h, now):
                h.stop_killed = True
                h.proc.kill()

    def _judge_at_stop(self, h: _Handle, now: float) -> bool:
        """Whether a worker busy past a budget stop's deadline is left to its watchdogs, not killed unjudged: its
        step outlasted the step timeout on a first step's longer leash (a compile, or a kernel that never ends).
        An interrupt stops at its deadline: a resumed campaign runs the step again."""
        outlasted = h.status == "busy" and now - h.last_event > self.cfg.step_timeout
        return self.stop_reason.endswith("budget spent") and h.leash > 1.0 and outlasted

    def _snapshot(self) -> Snapshot:
        by_id = dict(collections.Counter(f.id for f in self.store.findings.values()))
        lines = [
            WorkerLine(
                h.index,
                h.status,
                self.store.worker(h.index).steps_done + h.executed,
                h.rate(),
                h.job.target + " " + h.job.id if h.job else "",
            )
            for h in self.handles.values()
        ]
        wss = self.store.workers.values()
        return Snapshot(
            self.store.elapsed(),
            self._remaining_text(),
            self.store.steps_done() + sum(h.executed for h in self.handles.values() if h.job is not None),
            lines,
            by_id,
            len(self.store.shapes),
            sum(w.crashes for w in wss),
            sum(w.restarts for w in wss),
            len(self.store.corpus_done),
        )

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

        def on_signal(signum: int, frame: object) -> None:
            self._stop(f"interrupted by {signal.Signals(signum).name}")

        for s in old:
            signal.signal(s, on_signal)
        try:
            yield
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    def run(self) -> Outcome:
        """Run until the budget is spent (or a signal / fatal error); returns the outcome."""
        if self.cfg.time_budget is None and self.cfg.step_budget is None:
            raise InvalidArgument("a campaign needs a budget: --time or --steps")
        with contextlib.suppress(Exception):
            self._poll_corpus()
        with self._signals():
            for w in range(self.cfg.workers):
                self._spawn(w)
            last_save = last_poll = time.monotonic()
            while True:
                try:
                    w, gen, line = self.events.get(timeout=0.2)
                    self._handle_event(w, gen, line)
                    while True:
                        w, gen, line = self.events.get_nowait()
                        self._handle_event(w, gen, line)
                except queue.Empty:
                    pass
                self._check_timeouts()
                if not self.stopping:
                    t = self._time_left()
                    left = self._steps_left()
                    if t is not None and t <= 0:
                        self._stop("time budget spent")
                    elif left is not None and left <= 0 and all(h.job is None for h in self.handles.values()):
                        self._stop("step budget spent")
                if self.stopping and all(h.status in ("dead", "stopped") for h in self.handles.values()):
                    break
                self._assign()
                now = time.monotonic()
                if now - last_save > self.save_every:
                    self.store.save()
                    last_save = now
                if now - last_poll > self.corpus_poll and not self.stopping:
                    with contextlib.suppress(Exception):
                        self._poll_corpus()
                    last_poll = now
                self.progress.update(self._snapshot())
        self.progress.update(self._snapshot(), force=True)
        self._ledger_news()
        self.store.close(stop_reason=self.stop_reason)
        if self.fatal is not None:
            return self.fatal
        if self.store.findings:
            return Outcome(EXIT_FINDINGS, self.stop_reason)
        if self.stop_reason.startswith("interrupted"):  # resumable; the run directory reads as incomplete
            return Outcome(EXIT_INTERRUPTED, self.stop_reason)
        return Outcome(EXIT_CLEAN, self.stop_reason)
