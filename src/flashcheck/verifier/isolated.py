"""Work done in a forked child process that sends back only its result: the static model (every file's tree, the
index, the analysis' caches) is built, used and dropped there, and the calling process receives the findings.

Freeing the model costs the process that built it over a second on a large tree (millions of AST nodes, freed one
by one); a child that leaves with ``os._exit`` hands its memory back to the system at once. The result must pickle;
an exception raised in the child is raised again in the caller (as `IsolatedError` with the child's traceback when
the exception itself does not pickle).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["IsolatedError", "Pending", "can_fork", "run_isolated", "start_isolated"]

T = TypeVar("T")


class IsolatedError(RuntimeError):
    """The child failed in a way that cannot be passed on as it was (an exception that does not pickle, or death)."""


def can_fork() -> bool:
    """Whether `run_isolated` may fork here: the platform has ``fork`` and no other thread runs (a fork copies only
    the calling thread, and a lock another thread holds would stay locked in the child)."""
    return hasattr(os, "fork") and threading.active_count() == 1


def run_isolated(work: Callable[[], T]) -> T:
    """``work()`` run in a forked child; its result (or its exception) comes back through a pipe. Call only where
    `can_fork` holds."""
    return start_isolated(work).result()


class Pending(Generic[T]):
    """A forked child at work (`start_isolated`); `result` waits for it."""

    def __init__(self, pid: int, read_end: int) -> None:
        self._pid, self._read_end = pid, read_end
        self._reaped = False

    def result(self) -> T:
        """The child's result, or its exception raised here (the child is reaped either way)."""
        pid, fd, self._read_end = self._pid, self._read_end, -1
        try:
            with os.fdopen(fd, "rb") as pipe:
                payload = pipe.read()
            _, status = os.waitpid(pid, 0)
        except BaseException:  # interrupted: the child must not outlive the call
            self.cancel()
            raise
        self._reaped = True
        try:
            ok, value = pickle.loads(payload)
        except Exception as exc:  # nothing (or not all) came back: the child died
            code = os.waitstatus_to_exitcode(status)
            raise IsolatedError(f"the static analysis process ended without a result (exit status {code})") from exc
        if ok:
            return value  # type: ignore[no-any-return]
        raise value

    def cancel(self) -> None:
        """Stop the child and reap it (its result is lost); nothing once `result` has reaped it."""
        if self._reaped:
            return
        self._reaped = True
        with contextlib.suppress(OSError):
            os.kill(self._pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self._pid, 0)
        if self._read_end >= 0:
            with contextlib.suppress(OSError):
                os.close(self._read_end)
            self._read_end = -1


def start_isolated(work: Callable[[], T]) -> Pending[T]:
    """Fork a child that runs ``work()`` and sends back its result; this process goes on meanwhile. Call only
    where `can_fork` holds."""
    read_end, write_end = os.pipe()
    try:
        pid = os.fork()
    except BaseException:
        os.close(read_end)
        os.close(write_end)
        raise
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        os.close(read_end)
        _child(work, write_end)
    os.close(write_end)
    return Pending(pid, read_end)


def _child(work: Callable[[], object], fd: int) -> None:  # pragma: no cover - runs in the child
    code = 1
    try:
        try:
            payload = pickle.dumps((True, work()), protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException as exc:
            try:
                payload = pickle.dumps((False, exc), protocol=pickle.HIGHEST_PROTOCOL)
                pickle.loads(payload)  # an exception whose constructor takes other arguments does not load
            except Exception:
                text = "".join(traceback.format_exception(exc))
                payload = pickle.dumps((False, IsolatedError(f"the static analysis process failed:\n{text}")))
        with os.fdopen(fd, "wb") as pipe:
            pipe.write(payload)
        code = 0
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
