"""FC252 step-hung: a per-step watchdog, and the finding for a step that outlived its timeout.

The watchdog works in two tiers. At the timeout it records the Python stacks of every thread and raises `StepHung`
in the thread running the step; a step stuck in Python code (a busy loop, a lock) comes back with the finding and
the run goes on. A step stuck where Python cannot interrupt it (a kernel spinning on the GPU, a blocking CUDA call)
does not come back: after a grace period (and at most a tenth of the timeout and grace more: the C-level timer is kept
armed across steps, `_HardTimer`) the C-level `faulthandler` watchdog writes every thread's stack to the hang file
and, in isolated workers (``hard_exit``), ends the process, so the parent turns the hang file into the same finding
and starts a fresh worker. No torch here.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from flashcheck.check import Check
from flashcheck.errors import InvalidArgument
from flashcheck.findings import Finding, Frame, Location

__all__ = ["STEP_HUNG", "StepHung", "Watchdog", "default_step_timeout", "hang_finding", "read_hang_file"]

_HANG_HEADER = "flashcheck: step hung: "
_HEADER_BYTES = 1024  # the hang file's first line, padded: rewritten in place for every step


STEP_HUNG = Check(
    "FC252",
    "step-hung",
    "runtime",
    doc="""\
    A step (a target's plan, run, capture, prepare-replay or replay, with its kernels) did not finish in time.

    What it checks
        Every step runs under a watchdog (``step_timeout``, default 120 s, or ``FLASHCHECK_STEP_TIMEOUT``;
        ``--step-timeout`` on the command line; the first eager and capture step (and a first replay before any capture)
        of a session get five times as long, for lazy imports and kernel JIT compiles). When a step outlives it, the
        finding carries the Python stacks of every thread at that moment and the step's reproducer. A hang in Python
        code is interrupted; the session is then marked poisoned (the interrupt may have landed inside library code) and
        a fresh one goes on. A hang in a kernel or a blocking CUDA call cannot be interrupted, so isolated workers (the
        pytest plugin and ``flashcheck fuzz`` on a GPU, campaign workers) write the stacks and exit, and their parent
        records this finding and starts a fresh worker for the remaining steps.

    Why it breaks serving
        A kernel that never finishes (a loop bound read from a stale or unbound plan buffer, a wait on a flag no
        other block sets) freezes the GPU for every request; the engine's watchdog then kills the process. A host
        thread blocked on a lock or a full queue stalls the scheduler the same way.

    Example
        A decode wrapper built without ``use_cuda_graph=True`` is captured and re-planned before every replay: the
        re-plan moves the buffers the graph reads, and the replayed kernel spins on garbage split counts::

            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")   # no use_cuda_graph=True

    Use instead
        Build graph-mode wrappers with ``use_cuda_graph=True`` and the persistent buffers the graph reads, re-plan
        them with the bucket's padded batch, and reproduce the hang under ``flashcheck replay REPRO --sanitizer
        memcheck`` to see which kernel runs away.

    Known false positives
        A step that is only slow (a JIT compile on first use, a very large batch on a slow GPU) is reported when
        the timeout is shorter than it: raise ``--step-timeout``.
    """,
)


class StepHung(BaseException):
    """Raised asynchronously in the thread running a step that outlived the watchdog's timeout."""


def _thread_stacks(skip_thread: int | None = None) -> dict[str, list[Frame]]:
    names = {t.ident: t.name for t in threading.enumerate()}
    out: dict[str, list[Frame]] = {}
    for ident, frame in sys._current_frames().items():
        if ident == skip_thread:
            continue
        frames = [
            Frame(fs.filename, fs.lineno or 0, fs.name, (fs.line or "").strip())
            for fs in traceback.extract_stack(frame)
        ]
        out[f"{names.get(ident, 'thread')} ({ident})"] = frames
    return out


class _Timers:
    """One daemon thread for every watchdog of the process: arming a step costs a lock and a notify, not a new
    thread (a `threading.Timer` per step cost about 0.2 ms, a few percent of a step). An entry is a deadline and
    what to call then, under a key (a watchdog's step timer, or its guard of the C-level timer)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[tuple[Watchdog, str], tuple[float, Callable[[], None]]] = {}
        self._thread: threading.Thread | None = None

    def forget(self) -> None:
        """No timer thread and nothing due (a forked child: the parent's thread, and maybe its lock, are gone)."""
        self._cond = threading.Condition()
        self._due = {}
        self._thread = None

    def set(self, key: tuple[Watchdog, str], deadline: float, call: Callable[[], None]) -> None:
        with self._cond:
            self._due[key] = (deadline, call)
            if self._thread is None or not self._thread.is_alive():  # first use, or a forked child
                self._thread = threading.Thread(target=self._loop, name="flashcheck-watchdog", daemon=True)
                self._thread.start()
            self._cond.notify()

    def clear(self, key: tuple[Watchdog, str]) -> None:
        with self._cond:  # no notify: the thread wakes at the old deadline, finds nothing due, and waits on
            self._due.pop(key, None)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    expired = [(key, call) for key, (deadline, call) in self._due.items() if deadline <= now]
                    if expired:
                        for key, _ in expired:
                            del self._due[key]
                        break
                    nearest = min((deadline for deadline, _ in self._due.values()), default=None)
                    self._cond.wait(None if nearest is None else nearest - now)
            for _, call in expired:  # outside the condition: a watchdog takes its own lock
                call()


class _HardTimer:
    """The process's one C-level timer (`faulthandler.dump_traceback_later`), kept armed across steps.

    Arming and cancelling it starts and joins a thread in CPython (about 0.1 ms a pair on a GPU node's host, two
    pairs a step). So a step leaves it armed when it fires no earlier than the step's limit plus grace and at most
    `_SLACK` of the watchdog's timeout plus grace later, and re-arms it otherwise; a watchdog that is disarmed has its
    timer thread cancel the C-level timer shortly before it would fire (`_GUARD`), so nothing is written, and no
    worker ends, while no step runs. An uninterruptible hang is therefore written out at most that much later than
    its limit plus grace; the Python-level tier fires at the limit as before."""

    def __init__(self) -> None:
        self.steps = 0  # steps armed so far: a guard set before the latest one is stale
        self.forget()

    def forget(self) -> None:
        """No C-level timer armed (also a forked child's state: the parent's timer threads do not run in it)."""
        self._lock = threading.Lock()
        self.owner: Watchdog | None = None
        self.deadline = 0.0  # monotonic time at which the armed C-level timer fires (0: none armed)
        self.where: tuple[IO[str] | int, bool] | None = None  # where it writes, and whether it ends the process
        self._forked: tuple[Watchdog, float, IO[str] | int, bool] | None = None

    def ensure(self, wd: Watchdog, span: float, out: IO[str] | int, exit: bool) -> None:
        """The C-level timer armed for `wd`, firing between `span` seconds from now and `wd`'s slack later, writing
        to `out`."""
        _TIMERS.clear((wd, "hard"))
        slack = _SLACK * (wd.timeout + wd.grace)
        with self._lock:
            self.steps += 1
            now = time.monotonic()
            kept = self.where is not None and self.where[0] is out and self.where[1] == exit
            if self.owner is wd and kept and now + span <= self.deadline <= now + span + slack:
                return
            faulthandler.dump_traceback_later(span + slack, repeat=False, file=out, exit=exit)
            self.owner, self.deadline, self.where = wd, now + span + slack, (out, exit)

    def before_fork(self) -> None:
        """Cancel the C-level timer across a fork: a child would inherit its thread's lock held, and hang in its
        first arm or at exit. The parent re-arms it for what is left (`after_fork_in_parent`)."""
        self._lock.acquire()
        if self.owner is not None and self.where is not None:
            faulthandler.cancel_dump_traceback_later()
            self._forked = (self.owner, self.deadline, *self.where)
            self.owner, self.deadline = None, 0.0

    def after_fork_in_parent(self) -> None:
        forked, self._forked = self._forked, None
        if forked is not None:
            wd, deadline, out, exit = forked
            left = deadline - time.monotonic()
            if left > 0:
                with contextlib.suppress(ValueError, OSError):
                    faulthandler.dump_traceback_later(left, repeat=False, file=out, exit=exit)
                    self.owner, self.deadline = wd, deadline
        self._lock.release()

    def guard(self, wd: Watchdog) -> None:
        """Have the timer thread cancel `wd`'s C-level timer before it fires, unless a step is armed by then."""
        with self._lock:
            if self.owner is not wd:
                return
            margin = min(_GUARD, max(self.deadline - time.monotonic(), 0.0) / 2)
            due, steps = self.deadline - margin, self.steps
        _TIMERS.set((wd, "hard"), due, lambda: self._cancel(wd, steps))

    def cancel(self, wd: Watchdog) -> None:
        """Cancel the C-level timer if it is `wd`'s."""
        _TIMERS.clear((wd, "hard"))
        self._cancel(wd, None)

    def _cancel(self, wd: Watchdog, steps: int | None) -> None:
        with self._lock:
            if self.owner is wd and (steps is None or steps == self.steps):
                faulthandler.cancel_dump_traceback_later()
                self.owner, self.deadline = None, 0.0


_SLACK = 0.1  # how much later than its step's limit plus grace the kept C-level timer may fire (of timeout + grace)
_GUARD = 1.0  # seconds before a kept C-level timer fires at which an idle watchdog cancels it
_TIMERS = _Timers()
_HARD = _HardTimer()
# a forked child has no C-level timer thread (nor the timer thread that guards it): its first step arms afresh


def _forget_in_child() -> None:
    _HARD.forget()
    _TIMERS.forget()


os.register_at_fork(
    before=_HARD.before_fork, after_in_parent=_HARD.after_fork_in_parent, after_in_child=_forget_in_child
)


class Watchdog:
    """Arms a timer around one step at a time (`arm` / `disarm`); thread-safe against its own timer thread.

    Args:
        timeout: seconds a step may take.
        grace: seconds after the timeout before the C-level watchdog writes every stack to `hang_file` (and, with
            `hard_exit`, ends the process); default: a third of the timeout, at most 15 s.
        hang_file: where the C-level watchdog writes; None: standard error.
        hard_exit: end the process when the step does not come back (isolated workers only: never in a user's
            own process, where the stacks are written and the process is left alone).
    """

    def __init__(
        self, timeout: float, *, grace: float | None = None, hang_file: Path | None = None, hard_exit: bool = False
    ) -> None:
        self.timeout = float(timeout)
        self.grace = float(grace) if grace is not None else min(15.0, max(0.25, self.timeout / 3))
        self.hang_file = hang_file
        self.hard_exit = hard_exit
        self.fired = False
        self.stacks: dict[str, list[Frame]] = {}
        self.label = ""
        self._lock = threading.Lock()
        self._armed = False
        self._gen = 0  # arm generation: an expiry of an earlier arm does nothing
        self._thread = 0
        self._fd: int | None = None  # the hang file, open for the session
        self._limit = self.timeout

    def arm(self, label: str, *, scale: float = 1.0) -> None:
        """Start watching the calling thread's step `label`, for `scale` times the timeout."""
        with self._lock:
            self.fired, self.stacks, self.label = False, {}, label
            self._thread = threading.get_ident()
            self._limit = self.timeout * scale
            self._gen += 1
            gen = self._gen
        self._arm_hard(label)  # first: if the hang file cannot be written, no timer is left armed behind the error
        with self._lock:
            self._armed = True
        _TIMERS.set((self, "step"), time.monotonic() + self._limit, lambda: self._expire(gen))

    @property
    def limit(self) -> float:
        """The timeout of the step watched now (or last)."""
        return self._limit

    def disarm(self) -> None:
        """Stop watching. A `StepHung` already fired is delivered before the step's caller leaves the block that
        catches it (the interpreter checks for it at every call and backward jump). It is never withdrawn with
        ``PyThreadState_SetAsyncExc(id, NULL)``: CPython 3.11 then leaves its eval breaker set for good, and the
        whole process runs many times slower."""
        with self._lock:
            self._armed = False
        _TIMERS.clear((self, "step"))
        _HARD.guard(self)  # the C-level timer stays armed for the next step, and is cancelled if none comes in time
        # the hang file stays open for the next step, holding only its header: `read_hang_file` reads no dump

    def close(self) -> None:
        """Disarm and remove the hang file (the end of a session that ends normally; a worker that exits at once
        after a fault leaves it holding only its header, which `read_hang_file` reads as no dump)."""
        self.disarm()
        _HARD.cancel(self)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            if self.hang_file is not None:
                self.hang_file.unlink(missing_ok=True)

    def _arm_hard(self, label: str) -> None:
        out: IO[str] | int = sys.stderr
        if self.hang_file is not None:
            # A fixed-size header rewritten in place: one pwrite per step (an open, a write and an unlink per step
            # cost ~70 us). The file offset stays behind the header, where the C-level watchdog writes its dump.
            head = f"{_HANG_HEADER}{label} (timeout {self._limit:g}s)".encode("utf-8", errors="replace")
            head = head[: _HEADER_BYTES - 1].ljust(_HEADER_BYTES - 1) + b"\n"
            if self._fd is None:
                fd = os.open(self.hang_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    os.write(fd, head)
                except BaseException:
                    os.close(fd)
                    raise
                self._fd = fd
            else:
                if os.lseek(self._fd, 0, os.SEEK_CUR) != _HEADER_BYTES:  # a dump of an earlier step (no hard exit)
                    os.ftruncate(self._fd, _HEADER_BYTES)
                    os.lseek(self._fd, _HEADER_BYTES, os.SEEK_SET)
                os.pwrite(self._fd, head, 0)
            out = self._fd
        # no usable file descriptor (a captured stderr): the first tier alone
        with contextlib.suppress(ValueError, OSError, AttributeError):
            _HARD.ensure(self, self._limit + self.grace, out, self.hard_exit)

    def _expire(self, gen: int) -> None:
        with self._lock:
            if not self._armed or gen != self._gen:  # disarmed, or armed again for a later step, meanwhile
                return
            self.stacks = _thread_stacks(skip_thread=threading.get_ident())
            self.fired = True
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._thread), ctypes.py_object(StepHung))


def hang_finding(
    *,
    target: str,
    step: int,
    step_name: str,
    timeout: float,
    stacks: Mapping[str, list[Frame]] | str,
    region: str | None = None,
) -> Finding:
    """The FC252 finding for a step that outlived `timeout`; `stacks` per thread, or the hang file's text."""
    main: tuple[Frame, ...] = ()
    if isinstance(stacks, str):
        text = stacks
    else:
        text = "\n".join(
            f"{name}:\n" + "".join(f"  {f.file}:{f.line} in {f.function}\n" for f in frames)
            for name, frames in stacks.items()
        )
        main = next((tuple(fr) for name, fr in stacks.items() if name.startswith("MainThread")), ())
    return STEP_HUNG.finding(
        f"step {step} ({step_name}) did not finish within {timeout:g}s" + (f" (in `{region}`)" if region else ""),
        hint="the stacks show where every thread was; replay the reproducer under --sanitizer memcheck to find "
        "the kernel that runs away, or raise --step-timeout if the step is only slow",
        location=Location(target=target, step=step, step_name=step_name, region=region),
        stack=main,
        evidence={"check": "hang", "timeout_s": timeout, "threads": text[-20000:]},
    )


def read_hang_file(path: Path) -> tuple[str, str] | None:
    """(label, stacks text) from a hang file the C-level watchdog wrote, or None if it holds no dump."""
    try:
        text = path.read_text("utf-8", errors="replace")
    except OSError:
        return None
    head, _, rest = text.partition("\n")
    if not head.startswith(_HANG_HEADER) or not rest.strip():
        return None
    return head[len(_HANG_HEADER) :].rstrip(), rest


def default_step_timeout(device: str) -> float | None:
    """120 s (a first JIT compile of a FlashInfer kernel family takes up to ~80 s), or ``FLASHCHECK_STEP_TIMEOUT``
    (0: no watchdog). `device` is kept for callers that size it per device."""
    env = os.environ.get("FLASHCHECK_STEP_TIMEOUT")
    if env:
        try:
            value = float(env)
        except ValueError:
            raise InvalidArgument(f"FLASHCHECK_STEP_TIMEOUT={env!r} is not a number of seconds") from None
        return value if value > 0 else None
    return 120.0
