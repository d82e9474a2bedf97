"""The campaign worker process: runs scenario chunks against the target and reports every step to the supervisor.

Started by the supervisor as ``python -m flashcheck.campaign.worker serve ...``. Commands arrive as JSON lines on
stdin, events leave as JSON lines on a private copy of stdout (the target's own prints are redirected to stderr,
which the supervisor logs). Before a chunk runs, its scenario is written atomically to
``RUN_DIR/workers/W/inflight.json``: if this process dies, the supervisor still knows what it was running.

``python -m flashcheck.campaign.worker repro FILE`` replays a reproducer in this very process, so a reproducer
of a crash (FC251) crashes it the same way; the exit status is 1 when the recorded finding comes back.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import threading
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from flashcheck.campaign.ledger import Ledger, load_ledger
from flashcheck.campaign.options import CampaignConfig
from flashcheck.errors import EnvironmentUnavailable, FlashcheckError, ViolationFound
from flashcheck.findings import atomic_write_text
from flashcheck.known import split_known
from flashcheck.rundir import environment
from flashcheck.scenario import Scenario

__all__ = ["EXIT_POISONED", "HANG_FILE", "WATCHDOG_SHARE", "main"]

EXIT_POISONED = 75  # the CUDA context is poisoned (the finding was reported): restart me, no FC251
HANG_FILE = "hang.txt"  # what the step watchdog writes before it ends a hung worker (FC252)
WATCHDOG_SHARE = 0.6  # of --step-timeout: the worker's watchdog (+ its grace) ends a hung step before the supervisor


class _Commands:
    """Reads supervisor commands on a thread so the step loop can notice 'stop' between steps."""

    def __init__(self, stream: TextIO) -> None:
        self.queue: queue.Queue[dict[str, Any]] = queue.Queue()
        self.stop = threading.Event()
        self._stream = stream
        threading.Thread(target=self._read, name="flashcheck-commands", daemon=True).start()

    def _read(self) -> None:
        for line in self._stream:
            try:
                cmd = json.loads(line)
            except json.JSONDecodeError:
                continue
            if cmd.get("cmd") == "stop":
                self.stop.set()
            self.queue.put(cmd)
        self.stop.set()  # EOF: the supervisor is gone; finish the current step and leave
        self.queue.put({"cmd": "stop"})


class Worker:
    def __init__(self, run_dir: Path, index: int, cfg: CampaignConfig, out: TextIO) -> None:
        self.dir = run_dir / "workers" / str(index)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.index = index
        self.cfg = cfg
        self.out = out
        self.ledger = load_ledger(cfg.ledger) if cfg.ledger else Ledger()
        self.device = None if cfg.device == "auto" else cfg.device

    def emit(self, event: str, **fields: Any) -> None:
        self.out.write(json.dumps({"ev": event, **fields}, default=str) + "\n")
        self.out.flush()

    def scenario_for(self, cmd: Mapping[str, Any]) -> tuple[Any, Scenario]:
        from flashcheck.fuzzing.scenarios import random_steps
        from flashcheck.targets.registry import make_target

        if cmd["kind"] == "corpus":
            scen = Scenario.from_dict(cmd["scenario"])
            return make_target(scen.target, **dict(scen.target_config)), scen
        spec, seed = str(cmd["target"]), int(cmd["seed"])
        tgt = make_target(spec, **dict(self.cfg.target_config))
        steps = random_steps(tgt.capacity, self.cfg.chunk_steps, seed)[: int(cmd["n"])]
        return tgt, Scenario(spec, tuple(steps), seed, dict(self.cfg.target_config))

    def run_job(self, cmd: Mapping[str, Any], stop: threading.Event) -> None:
        from flashcheck.driver import warms_up
        from flashcheck.session import open_session

        job = cmd["job"]
        try:
            tgt, scen = self.scenario_for(cmd)
        except EnvironmentUnavailable as exc:
            self.emit("env", job=job, target=cmd.get("target"), reason=exc.reason)
            self.emit("done", job=job, steps=0)
            return
        hit = self.ledger.skip_scenario(scen)
        if hit is not None:
            self.emit("skipped", job=job, steps=len(scen.steps), reasons=[hit.reason])
            self.emit("done", job=job, steps=0)
            return
        scen, reasons = self.ledger.filter_steps(scen)
        atomic_write_text(
            self.dir / "inflight.json",
            json.dumps({"job": job, "worker": self.index, "pid": os.getpid(), "scenario": scen.to_dict()}, indent=1)
            + "\n",
        )
        if reasons:
            self.emit("skipped", job=job, steps=len(reasons), reasons=sorted(set(reasons)))
        self.emit("begin", job=job, steps=len(scen.steps))
        # setting the session up (lazy imports, the target's kernels compiled on first use) is waited for as long as
        # a first step of its kind; the supervisor goes back to one timeout when the target is set up
        self.emit("leash", job=job, i=-1, scale=self.cfg.warm_up_scale)
        executed = 0
        # the worker's own watchdog fires first (its stacks become FC252); the supervisor's kill is the backstop
        timeout = self.cfg.step_timeout * WATCHDOG_SHARE
        try:
            with open_session(
                tgt,
                device=self.device,
                layers=self.cfg.layers,  # type: ignore[arg-type]
                seed=scen.seed,
                worker=self.index,
                step_timeout=timeout,
                hang_file=self.dir / HANG_FILE,
                hard_exit=True,
                warm_up_scale=self.cfg.warm_up_scale,
                async_pressure_us=self.cfg.async_pressure_us,
            ) as drv:
                self.emit("target", job=job, name=drv.target.name, environment={**environment(), **drv.layer_facts()})
                sent = self.exercised(job, drv, {})

                def report(done: list[tuple[int, Any]]) -> None:
                    nonlocal sent
                    for i, r in done:
                        sent = self.exercised(job, drv, sent)
                        # documented upstream behaviours (flashcheck.known) are counted, not reported as findings
                        unexpected, known = split_known(r.findings, drv.target.name)
                        self.emit(
                            "step",
                            job=job,
                            i=i,
                            sample=r.sample.to_dict() if r.sample else None,
                            findings=[f.to_dict() for f in unexpected],
                            rejected=r.rejected,
                            known=[k.key for _, k in known],
                        )
                        if drv.poisoned and i == done[-1][0]:
                            self.emit("poisoned", job=job, i=i)
                            self.out.flush()
                            os._exit(EXIT_POISONED)

                for i, step in enumerate(scen.steps):
                    if stop.is_set():
                        break
                    if warms_up(step.op):  # the first step of its kind here: the supervisor waits as long as we do
                        report(drv.finish())  # the step before settles first: its event is not held back
                        self.emit("leash", job=job, i=i, scale=self.cfg.warm_up_scale)
                    # the step before settles once this one is prepared, and is reported before this one runs
                    try:  # when it poisoned the process, this one will not run
                        done = drv.prepare(step, i)
                    except FlashcheckError:  # a step we were called wrong with: the one before is still reported
                        report(drv.finish())
                        raise
                    report(done)
                    drv.launch()
                    executed += 1
                    if drv.poisoned:  # this step faulted or hung: reported at once
                        report(drv.finish())
                report(drv.finish())
        except EnvironmentUnavailable as exc:  # an explicit cause, established by the classification table
            self.emit("env", job=job, target=scen.target, reason=exc.reason)
        except ViolationFound as exc:  # the target's own setup raised: a finding; a fresh process for what follows
            self.emit("step", job=job, i=0, sample=None, findings=[f.to_dict() for f in exc.findings], rejected=None)
            self.emit("poisoned", job=job, i=0, setup=True)
            self.out.flush()
            os._exit(EXIT_POISONED)
        self.emit("done", job=job, steps=executed)

    def exercised(self, job: str, drv: Any, sent: dict[str, Any]) -> dict[str, Any]:
        """Tell the supervisor what the session exercised of the checks (`Driver.exercised`) when it changed since
        `sent`, before the step's own event: a worker that dies next has reported it. Returns what it sent."""
        checks: dict[str, Any] = drv.exercised().to_dict()
        if checks != sent:
            self.emit("exercised", job=job, name=drv.target.name, checks=checks)
        return checks

    def serve(self, commands: _Commands) -> None:
        import torch  # noqa: F401  (so that environment() reports torch and the device)

        self.emit("ready", pid=os.getpid(), environment=environment())
        while True:
            cmd = commands.queue.get()
            if cmd.get("cmd") == "stop" or commands.stop.is_set():
                return
            if cmd.get("cmd") == "run":
                self.run_job(cmd, commands.stop)


def _serve(args: argparse.Namespace) -> int:
    # the protocol gets a private copy of stdout; fd 1 (print() in the target) goes to stderr, the worker's log
    out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    commands = _Commands(sys.stdin)
    worker: Worker | None = None
    try:
        worker = Worker(Path(args.run_dir), args.worker, CampaignConfig.from_dict(json.loads(args.config)), out)
        worker.serve(commands)
    except BaseException as exc:  # report the cause to the supervisor, then die with it
        msg = "".join(traceback.format_exception(exc))
        out.write(json.dumps({"ev": "error", "message": msg}) + "\n")
        out.flush()
        return 2
    return 0


def _repro(args: argparse.Namespace) -> int:
    from flashcheck.repro import load_repro, replay_repro

    findings, hit = replay_repro(load_repro(args.file), device=args.device, isolate=False)
    sys.stdout.write("".join(f"{f}\n" for f in findings) + f"reproduced: {hit}\n")
    return 1 if hit else 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashcheck.campaign.worker")
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("serve", help="run chunks for a campaign supervisor (JSON lines on stdin/stdout)")
    s.add_argument("--run-dir", required=True)
    s.add_argument("--worker", type=int, required=True)
    s.add_argument("--config", required=True, help="CampaignConfig as JSON")
    r = sub.add_parser("repro", help="replay a reproducer in this process (a crash reproducer crashes it)")
    r.add_argument("file")
    r.add_argument("--device", default=None)
    args = p.parse_args(argv)
    return _serve(args) if args.mode == "serve" else _repro(args)


if __name__ == "__main__":
    sys.exit(main())
