"""Worker processes forked from a warm interpreter: `spawn` starts ``python -m MODULE ARGS`` as `subprocess.Popen`
would, but by forking a zygote, a process that has imported numpy, torch, torch's compiler stack (which the first op
under a dispatch mode imports) and flashcheck's worker modules once, so a worker does not pay their import again
(about 4 s of CPU; a campaign or a fuzz run restarts a worker after every fault and hang).

The zygote is a separate single-threaded process started once per parent (``python -m flashcheck._spawn``, with
the parent's ``sys.path``); it never initialises CUDA, so a forked worker sets up its own context as a fresh one
does. Each request passes the worker's stdin, stdout and stderr as file descriptors over a Unix socket; the worker
then takes the request's environment, working directory, ``sys.path`` and process group (the parent's, or a session
of its own), and runs the module as ``__main__``. The zygote reaps its workers and sends their exit statuses back,
so `Worker` answers ``poll``/``wait``/``kill``/``returncode`` as a `Popen` does (a signal's death is ``-signum``).

`spawn` falls back to a plain `subprocess.Popen` when forking cannot serve the request the same way: off Linux, with
``FLASHCHECK_ZYGOTE=0``, when the request's environment differs from the zygote's in what an interpreter or torch
reads at start-up (``PYTHON*``, ``LD_*``, ``TORCH*``, ``OMP_*``, ...), when torch would import from elsewhere, or
when the zygote cannot start.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import io
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

__all__ = ["Worker", "spawn"]

_STARTUP = ("PYTHON", "LD_", "TORCH", "PYTORCH", "OMP_", "MKL_", "KMP_", "OPENBLAS", "MALLOC_", "GLIBC_")
# torch's compiler stack is imported by the first op under a dispatch mode (the dispatch layer's warm-up): about 2 s
_PRELOAD = ("numpy", "torch", "torch._dynamo", "flashcheck.isolation", "flashcheck.campaign.worker")
_SAME_ORIGIN = ("flashcheck", "numpy", "torch")  # imported in the zygote: a worker must find them where it did
_MAX_MESSAGE = 1 << 20


def _startup_env(env: Mapping[str, str]) -> dict[str, str]:
    """What an interpreter, torch or its libraries read when they start (``sys.path`` is compared apart)."""
    return {k: v for k, v in env.items() if k.startswith(_STARTUP) and k != "PYTHONPATH"}


def _origin(name: str, path: Sequence[str]) -> str | None:
    spec = importlib.machinery.PathFinder.find_spec(name, list(path))
    return spec.origin if spec is not None else None


class Worker:
    """A process the zygote forked: the part of `subprocess.Popen`'s interface the supervisors use."""

    def __init__(self, pid: int, zygote: _Zygote, stdin: IO[str], stdout: IO[str]) -> None:
        self.pid = pid
        self.stdin: IO[str] | None = stdin
        self.stdout: IO[str] | None = stdout
        self.returncode: int | None = None
        self._zygote = zygote

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.status(self.pid, timeout=0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._zygote.status(self.pid, timeout=timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class _Zygote:
    """The parent's side of one zygote: requests, and the exit statuses it sends back."""

    def __init__(self, env: Mapping[str, str], path: Sequence[str]) -> None:
        self.startup = _startup_env(env)
        self.origins = {name: _origin(name, path) for name in _SAME_ORIGIN}
        self.lock = threading.Lock()
        self.statuses: dict[int, int] = {}
        self.dead = False
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        start_env = dict(env)
        start_env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "flashcheck._spawn", str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=start_env,
            )
        finally:
            theirs.close()
        ready = self._receive(timeout=120.0)
        if ready is None or not ready.get("ready"):
            self.close()
            raise OSError("the zygote did not start")

    def serves(self, env: Mapping[str, str], path: Sequence[str]) -> bool:
        """Whether a worker forked from this zygote starts as ``python`` with `env` and `path` would."""
        if self.dead or _startup_env(env) != self.startup:
            return False
        return all(_origin(name, path) == origin for name, origin in self.origins.items())

    def fork(self, request: dict[str, Any], fds: Sequence[int]) -> int:
        with self.lock:
            socket.send_fds(self.sock, [json.dumps(request).encode()], list(fds))
            while True:
                msg = self._receive(timeout=60.0)
                if msg is None:
                    raise OSError("the zygote did not answer")
                if "pid" in msg:
                    pid = int(msg["pid"])
                    self.statuses.pop(pid, None)  # an earlier process's with the same pid: its exit came before
                    return pid

    def status(self, pid: int, timeout: float | None) -> int | None:
        """`pid`'s exit code once the zygote reaped it; None while it runs after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self.lock:
                while self._receive(timeout=0.0) is not None:
                    pass
                if pid in self.statuses:
                    return self.statuses.pop(pid)
                orphan = self._orphan_status(pid) if self.dead else None
                if orphan is not None:
                    return orphan
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            pause = 0.05 if left is None else min(left, 0.05)
            if self.dead:
                time.sleep(pause)
            else:
                select.select([self.sock], [], [], pause)

    @staticmethod
    def _orphan_status(pid: int) -> int | None:
        """A worker of a zygote that died: running while its process exists and is no zombie; no status is known
        once it ended (reported as killed)."""
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return -signal.SIGKILL
        return -signal.SIGKILL if state in ("Z", "X") else None

    def _receive(self, timeout: float) -> dict[str, Any] | None:
        """One message (exit statuses are filed away and returned too); None when none came within `timeout`."""
        if self.dead or not select.select([self.sock], [], [], timeout)[0]:
            return None
        try:
            data = self.sock.recv(_MAX_MESSAGE)
        except OSError:
            data = b""
        if not data:
            self.dead = True
            return None
        msg: dict[str, Any] = json.loads(data)
        if "exit" in msg:
            self.statuses[int(msg["exit"])] = int(msg["code"])
        return msg

    def close(self) -> None:
        self.dead = True
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)


class _Current:
    """This process's zygote (one per parent; a forked child starts its own)."""

    zygote: _Zygote | None = None
    failed = False  # no second try in this process: each would cost a start-up
    lock = threading.Lock()


def _forget_in_child() -> None:  # a forked parent's zygote socket is not the child's to use
    _Current.zygote, _Current.failed, _Current.lock = None, False, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _zygote(env: Mapping[str, str], path: Sequence[str]) -> _Zygote | None:
    with _Current.lock:
        if _Current.zygote is not None and _Current.zygote.dead:
            _Current.zygote.close()
            _Current.zygote = None
        if _Current.zygote is None and not _Current.failed:
            try:
                _Current.zygote = _Zygote(env, path)
            except OSError:
                _Current.failed = True
        return _Current.zygote


def enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether `spawn` forks from a zygote here (Linux, and ``FLASHCHECK_ZYGOTE`` is not ``0``)."""
    env = os.environ if env is None else env
    return sys.platform == "linux" and hasattr(socket, "send_fds") and env.get("FLASHCHECK_ZYGOTE", "1") != "0"


def spawn(
    module: str,
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    stderr: IO[Any] | None = None,
    new_session: bool = False,
) -> Worker | subprocess.Popen[str]:
    """Start ``python -m module *args`` with text pipes on stdin and stdout (line-buffered stdin), `stderr` the
    parent's when None, in the parent's process group or (`new_session`) a session of its own. ``PYTHONPATH`` in
    `env` is the worker's ``sys.path`` after its working directory, as for a fresh interpreter."""
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    zygote = _zygote(env, path) if enabled(env) else None
    if zygote is not None and zygote.serves(env, path):
        try:
            return _fork(zygote, module, args, env=env, path=path, stderr=stderr, new_session=new_session)
        except OSError:
            pass  # the zygote went away: start this worker the plain way
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        env=dict(env),
        text=True,
        bufsize=1,
        start_new_session=new_session,
    )


def _fork(
    zygote: _Zygote,
    module: str,
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    path: Sequence[str],
    stderr: IO[Any] | None,
    new_session: bool,
) -> Worker:
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err = stderr.fileno() if stderr is not None else 2
    request = {
        "module": module,
        "argv": list(args),
        "env": dict(env),
        "cwd": os.getcwd(),
        "path": list(path),
        "session": new_session,
        "pgid": os.getpgrp(),
    }
    try:
        pid = zygote.fork(request, [in_r, out_w, err])
    except BaseException:
        for fd in (in_r, in_w, out_r, out_w):
            os.close(fd)
        raise
    os.close(in_r)
    os.close(out_w)
    stdin = open(in_w, "w", buffering=1, encoding="utf-8")  # noqa: SIM115 (the worker's pipe, closed with it)
    stdout = open(out_r, encoding="utf-8")  # noqa: SIM115
    return Worker(pid, zygote, stdin, stdout)


# ---- the zygote process ----------------------------------------------------------------------------------------
def _serve(fd: int) -> int:
    """Preload, then fork a worker per request until the parent closes its socket. Returns in the parent (0) and,
    through `_become`, in each worker (its module's run)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's Ctrl-C is for the parent and its workers
    sock = socket.socket(fileno=fd)
    for name in _PRELOAD:
        with contextlib.suppress(ImportError):
            __import__(name)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sock.send(json.dumps({"ready": True}).encode())
    while True:
        readable = select.select([sock.fileno(), wake_r], [], [])[0]
        if wake_r in readable:
            os.read(wake_r, 4096)
        _reap(sock)
        if sock.fileno() not in readable:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 3)
        except OSError:
            data, fds = b"", []
        if not data:
            return 0  # the parent is gone; its workers run on
        request = json.loads(data)
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            for own in (sock.fileno(), wake_r, wake_w):
                os.close(own)
            return _become(request, fds)
        for received in fds:
            os.close(received)
        sock.send(json.dumps({"pid": pid}).encode())


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        with contextlib.suppress(OSError):
            sock.send(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}).encode())


def _become(request: Mapping[str, Any], fds: Sequence[int]) -> int:
    """In a forked worker: take the request's stdio, group, directory, environment and path, then run its module
    as ``__main__`` (its exit, or an uncaught exception, ends the process as it would a fresh interpreter)."""
    import runpy

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    if request["session"]:
        os.setsid()
    else:
        with contextlib.suppress(OSError):
            os.setpgid(0, int(request["pgid"]))
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    base = [p for p in sys.path[1:] if p not in _START_PATH]
    sys.path[:] = [request["cwd"], *request["path"], *base]
    unbuffered = bool(request["env"].get("PYTHONUNBUFFERED"))  # as -u would leave them
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 (the process's own streams)
    sys.stdout = _text(1, line=False, write_through=unbuffered)
    sys.stderr = _text(2, line=True, write_through=unbuffered, errors="backslashreplace")
    sys.argv = [request["module"], *request["argv"]]
    # a preloaded module run as __main__ runs anew, as `python -m` runs it (its imported copy stays apart, as in a
    # fresh interpreter that imports it later)
    sys.modules.pop(str(request["module"]), None)
    runpy.run_module(str(request["module"]), run_name="__main__", alter_sys=True)
    return 0


def _text(fd: int, *, line: bool, write_through: bool, errors: str = "strict") -> io.TextIOWrapper:
    raw = io.FileIO(fd, "w", closefd=False)
    buffered = io.BufferedWriter(raw)
    return io.TextIOWrapper(buffered, "utf-8", errors, line_buffering=line, write_through=write_through)


_START_PATH = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]

if __name__ == "__main__":
    sys.exit(_serve(int(sys.argv[1])))
