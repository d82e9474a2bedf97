"""An isolated session: the driver runs in a worker process, so a fault or a hang never ends the run.

`IsolatedDriver` has the driver's ``execute(step, index) -> StepResult`` and sends each step to a worker process
(``python -m flashcheck.isolation``) that holds the session (target, checker, KV cache). When a step poisons the
CUDA context (FC250) or hangs past its timeout (FC252), or the worker dies (FC251), the step's result carries the
finding and the next step runs in a fresh worker; steps that replay a bucket the fresh worker has not captured
capture it first, as an engine does at start-up. The pytest plugin and ``flashcheck fuzz`` use it on the GPU.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import queue
import select
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from flashcheck._spawn import Worker, spawn
from flashcheck.driver import WARM_UP_SCALE
from flashcheck.errors import EnvironmentUnavailable, FlashcheckError, InvalidArgument, ViolationFound
from flashcheck.exercised import Exercised
from flashcheck.findings import Finding
from flashcheck.rundir import Sample
from flashcheck.scenario import Step, StepResult
from flashcheck.targets.protocol import Target
from flashcheck.watchdog import hang_finding, read_hang_file

__all__ = ["IsolatedDriver"]

_GRACE = 30.0  # seconds past the worker's own watchdog (timeout + its grace) before the parent kills it


@dataclass(frozen=True)
class _Pending:
    """A step sent to a worker (`pid`), or answered at once (`result`: the target's setup raised)."""

    step: Step
    index: int
    pid: int | None
    result: StepResult | None


class IsolatedDriver:
    """Drop-in for `Driver.execute` with the session in a worker process (restarted after a fault or hang).

    Args:
        target: a built-in name or ``"module:Class"`` (an instance cannot cross the process boundary).
        config: the target's configuration.
        device, layers, seed: as for `open_session`.
        step_timeout: seconds a step may take in the worker (None: no watchdog there; the parent still gives up
            after `setup_timeout` per step and reports the worker as hung).
        setup_timeout: seconds the worker may take to start and set the target up (JIT compiles included).
        warm_up_scale: the first step of each kind in the worker may take this many timeouts.
        async_pressure_us: as for `open_session`.
    """

    def __init__(
        self,
        target: str,
        *,
        config: Mapping[str, Any] | None = None,
        device: str | None = None,
        layers: str = "all",
        seed: int = 0,
        step_timeout: float | None = 120.0,
        setup_timeout: float = 900.0,
        warm_up_scale: float = WARM_UP_SCALE,
        async_pressure_us: float | None = None,
    ) -> None:
        from flashcheck.targets.registry import make_target

        self.spec = target
        self.config = dict(config or {})
        self.target: Target = make_target(target, **self.config)  # name and capacity, in this process (no setup)
        self.device, self.layers, self.seed = device, layers, seed
        self.step_timeout = step_timeout
        self.setup_timeout = setup_timeout
        self.warm_up_scale = warm_up_scale
        self.async_pressure_us = async_pressure_us
        self.poisoned = False  # never: a poisoned worker is replaced
        self.restarts = 0
        self._proc: Worker | subprocess.Popen[str] | None = None
        self._events: queue.Queue[str | None] = queue.Queue()
        self._dir = Path(tempfile.mkdtemp(prefix="flashcheck-iso-"))
        self._hang_file = self._dir / "hang.txt"
        self._layer_facts: dict[str, str] = {}
        self._pending: collections.deque[_Pending] = collections.deque()
        self._retired: set[int] = set()  # workers stopped or killed by this driver
        self._exercised = Exercised()  # what every worker exercised so far (`Driver.exercised`), merged

    # ---- the driver's interface --------------------------------------------------------------------------------
    @property
    def cap(self) -> Any:
        return self.target.capacity

    def execute(self, step: Step, index: int) -> StepResult:
        self.submit(step, index)
        return self.collect()

    def submit(self, step: Step, index: int) -> None:
        """Send a step to the worker without waiting for it; `collect` returns the results in the order submitted.

        The worker runs the steps one after another, so the caller can prepare the next step meanwhile. A step sent
        to a worker that an earlier step's fault or hang took down runs again in a fresh worker when collected."""
        proc = self._proc
        if proc is not None and proc.poll() is not None and any(p.pid == proc.pid for p in self._pending):
            # the worker died with steps in flight: its fault (and its hang file) belongs to the oldest of them, so
            # no fresh worker starts before they are collected; this step is sent when it is (`collect`)
            self._pending.append(_Pending(step, index, proc.pid, None))
            return
        setup = self._ensure_started()
        if setup is not None:  # the target's setup raised: this step's finding; the next step tries again
            self._pending.append(_Pending(step, index, None, StepResult(setup, None)))
            return
        assert self._proc is not None
        self._send({"cmd": "step", "step": step.to_dict(), "i": index})
        self._pending.append(_Pending(step, index, self._proc.pid, None))

    def collect(self) -> StepResult:
        """The result of the oldest step submitted and not yet collected."""
        if not self._pending:
            raise InvalidArgument("collect() without a submitted step")
        p = self._pending.popleft()
        if p.result is not None:
            return p.result
        if p.pid in self._retired:  # its worker was replaced before it ran the step: send it (and those behind it)
            rest = list(self._pending)
            self._pending.clear()
            self.submit(p.step, p.index)
            for q in rest:
                if q.pid in self._retired:
                    self.submit(q.step, q.index)
                else:
                    self._pending.append(q)
            return self.collect()
        return self._await(p.step, p.index)

    @property
    def in_flight(self) -> int:
        """Steps submitted and not yet collected."""
        return len(self._pending)

    def _await(self, step: Step, index: int) -> StepResult:
        # a backstop only: the worker's own watchdog (with its warm-up leash and grace) answers first
        limit = (self.step_timeout * self.warm_up_scale + 15.0 + _GRACE) if self.step_timeout else self.setup_timeout
        ev = self._receive(limit)
        if ev is None:  # the worker died or hung past every watchdog
            return self._lost(step, index, hung=self._still_running())
        kind = ev.get("ev")
        if kind == "result":
            if ev.get("exercised") is not None:  # sent when it changed
                self._exercised = self._exercised.merged(Exercised.from_dict(ev["exercised"]))
            findings = [Finding.from_dict(d) for d in ev.get("findings", [])]
            sample = Sample.from_dict(ev["sample"]) if ev.get("sample") else None
            if ev.get("poisoned"):
                self._stop_worker()  # the finding is in hand; the next step starts a fresh worker
            return StepResult(findings, sample, rejected=ev.get("rejected"))
        self._raise(ev)
        raise AssertionError("unreachable")

    def reset_example(self) -> None:
        while self._pending:  # steps after an example's end: their results belong to no example
            p = self._pending.popleft()
            if p.result is None and p.pid not in self._retired:
                self._await(p.step, p.index)
        if self._proc is not None and self._proc.poll() is None:
            self._send({"cmd": "reset"})
            ev = self._receive(60.0)
            if ev is None or ev.get("ev") != "ok":
                self._stop_worker()

    def close(self) -> None:
        self._pending.clear()
        self._stop_worker()
        with contextlib.suppress(OSError):
            self._hang_file.unlink(missing_ok=True)
            self._dir.rmdir()

    def __enter__(self) -> IsolatedDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the worker ----------------------------------------------------------------------------------------
    def _ensure_started(self) -> list[Finding] | None:
        if self._proc is not None and self._proc.poll() is None:
            return None
        if self._proc is not None:
            self.restarts += 1
        self._events = queue.Queue()
        spec = {
            "target": self.spec,
            "config": self.config,
            "device": self.device,
            "layers": self.layers,
            "seed": self.seed,
            "step_timeout": self.step_timeout,
            "hang_file": str(self._hang_file),
            "warm_up_scale": self.warm_up_scale,
            "async_pressure_us": self.async_pressure_us,
        }
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # module:Class targets import the same way
        self._proc = spawn("flashcheck.isolation", [json.dumps(spec)], env=env)
        threading.Thread(target=self._read, args=(self._proc, self._events), daemon=True).start()
        ev = self._receive(self.setup_timeout)
        if ev is None:
            self._stop_worker()
            raise EnvironmentUnavailable(f"{self.spec}: the isolated worker did not start (see its stderr above)")
        if ev.get("ev") == "violation":
            self._stop_worker()
            return [Finding.from_dict(d) for d in ev.get("findings", [])]
        if ev.get("ev") != "ready":
            self._stop_worker()
            self._raise(ev)
        self._layer_facts = {str(k): str(v) for k, v in dict(ev.get("layers") or {}).items()}
        self._exercised = self._exercised.merged(Exercised.from_dict(ev.get("exercised")))
        return None

    def layer_facts(self) -> dict[str, str]:
        """What `Driver.layer_facts` said in the last worker started (empty before the first step)."""
        return dict(self._layer_facts)

    def exercised(self) -> Exercised:
        """What `Driver.exercised` said in every worker so far, merged (empty before the first step)."""
        return self._exercised.merged()

    @staticmethod
    def _read(proc: Worker | subprocess.Popen[str], events: queue.Queue[str | None]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            events.put(line)
        events.put(None)

    def _send(self, cmd: Mapping[str, Any]) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, OSError, ValueError):
            self._proc.stdin.write(json.dumps(cmd) + "\n")
            self._proc.stdin.flush()

    def _receive(self, timeout: float) -> dict[str, Any] | None:
        while True:
            try:
                line = self._events.get(timeout=timeout)
            except queue.Empty:
                return None
            if line is None:
                return None
            with contextlib.suppress(json.JSONDecodeError):
                ev: dict[str, Any] = json.loads(line)
                return ev

    def _stop_worker(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        self._retired.add(proc.pid)
        with contextlib.suppress(OSError, ValueError):
            if proc.stdin is not None:
                proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        self._proc = proc  # keep it for `restarts` accounting; poll() is not None now

    def _still_running(self) -> bool:
        """Whether the worker is still running once its output ended or went silent (a process that closed its
        output is given a moment to be reaped: a crash is not a hang)."""
        proc = self._proc
        if proc is None:
            return False
        try:
            proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            return True
        return False

    def _lost(self, step: Step, index: int, *, hung: bool) -> StepResult:
        from flashcheck.campaign.checks import crash_cause, crash_finding

        proc = self._proc
        if proc is not None:
            self._retired.add(proc.pid)
        if hung and proc is not None:
            proc.kill()
        rc = proc.wait() if proc is not None else None
        name = f"{step.op} bs={len(step.qo_lens)}" + (f" bucket={step.bucket}" if step.bucket else "")
        dump = read_hang_file(self._hang_file)
        self._hang_file.unlink(missing_ok=True)
        if dump is not None or hung:
            f = hang_finding(
                target=self.target.name,
                step=index,
                step_name=name,
                timeout=float(self.step_timeout or 0),
                stacks=dump[1] if dump is not None else "(the worker wrote no stacks: it was killed by its parent)",
            )
        else:
            f = crash_finding(
                target=self.target.name,
                step_index=index,
                step_name=name,
                op=step.op,
                cause=crash_cause(rc, False),
                evidence={"returncode": rc, "phase": "step"},
            )
        return StepResult([f], None)

    @staticmethod
    def _raise(ev: Mapping[str, Any]) -> None:
        kind, msg = ev.get("ev"), str(ev.get("message", ""))
        if kind == "env":
            raise EnvironmentUnavailable(msg)
        if kind == "usage":
            raise InvalidArgument(msg)
        raise RuntimeError(f"the isolated flashcheck worker failed:\n{msg}")


# ---- the worker process ----------------------------------------------------------------------------------------
def _serve(spec: Mapping[str, Any], out: IO[str]) -> int:
    from flashcheck.session import open_session

    def emit(**fields: Any) -> None:
        out.write(json.dumps(fields, default=str) + "\n")
        out.flush()

    try:
        with open_session(
            str(spec["target"]),
            config=spec.get("config") or None,
            device=spec.get("device"),
            layers=spec.get("layers", "all"),
            seed=int(spec.get("seed", 0)),
            step_timeout=spec.get("step_timeout"),
            hang_file=Path(spec["hang_file"]),
            hard_exit=True,
            warm_up_scale=float(spec.get("warm_up_scale", WARM_UP_SCALE)),
            async_pressure_us=spec.get("async_pressure_us"),
        ) as drv:
            sent = drv.exercised().to_dict()
            emit(ev="ready", pid=os.getpid(), layers=drv.layer_facts(), exercised=sent)

            def results(done: list[tuple[int, StepResult]]) -> None:
                nonlocal sent
                for n, (_, r) in enumerate(done, 1):
                    exercised = drv.exercised().to_dict()
                    changed, sent = exercised != sent, exercised
                    last = drv.poisoned and n == len(done)  # the step that poisoned the process is the last
                    emit(
                        ev="result",
                        findings=[f.to_dict() for f in r.findings],
                        sample=r.sample.to_dict() if r.sample else None,
                        rejected=r.rejected,
                        poisoned=last,
                        exercised=exercised if changed else None,
                    )
                    if last:
                        out.flush()
                        os._exit(0)  # nothing can run in this context, not even a clean teardown

            def settled() -> bool:
                # no step waiting in the pipe: send the submitted step's result once the device finished it
                if not drv.pending_ready():
                    return False
                results(drv.finish())
                return True

            commands = _Lines(sys.stdin.fileno())
            while (line := commands.next(idle=settled)) is not None:
                cmd = json.loads(line)
                if cmd.get("cmd") == "reset":
                    results(drv.finish())
                    drv.reset_example()
                    emit(ev="ok")
                    continue
                # the step before settles once this one is prepared, and is sent before this one runs
                try:
                    done = drv.prepare(Step.from_dict(cmd["step"]), int(cmd["i"]))
                except FlashcheckError:  # a step we were called wrong with: the one before is still sent
                    results(drv.finish())
                    raise
                results(done)
                drv.launch()
                if drv.poisoned:  # this step faulted or hung: sent at once
                    results(drv.finish())
            results(drv.finish())
    except EnvironmentUnavailable as exc:
        emit(ev="env", message=exc.reason)
    except ViolationFound as exc:  # the target's own setup raised: a finding, not an error of ours
        emit(ev="violation", findings=[f.to_dict() for f in exc.findings])
    except FlashcheckError as exc:
        emit(ev="usage", message=str(exc))
    except BaseException as exc:
        emit(ev="error", message="".join(traceback.format_exception(exc)))
        return 4
    return 0


class _Lines:
    """The lines of a file descriptor, read without Python's buffering so that `select` tells whether one waits."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = b""

    def next(self, idle: Callable[[], bool]) -> bytes | None:
        """The next line (None at the end). Until one arrives, `idle` is called between waits of 0.2 ms until it
        returns True; then the wait blocks."""
        waiting = True
        while b"\n" not in self.buf:
            if waiting and not select.select([self.fd], [], [], 0.0002)[0]:
                waiting = not idle()
                continue
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashcheck.isolation")
    p.add_argument("spec", help="session spec as JSON (target, config, device, layers, seed, step_timeout)")
    args = p.parse_args(argv)
    out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)  # the target's prints go to stderr; stdout carries the protocol
    rc = _serve(json.loads(args.spec), out)
    out.flush()
    sys.stderr.flush()
    # no interpreter finalization: torch's CUDA trace callbacks stay registered for the life of the process and
    # fail noisily once the interpreter has torn its builtins down
    os._exit(rc)


if __name__ == "__main__":
    sys.exit(main())
