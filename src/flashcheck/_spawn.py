"""Worker processes forked from a warm interpreter: `spawn` starts ``python -m MODULE ARGS`` as `subprocess.Popen`
would, but by forking a zygote, a process that has imported numpy, torch and flashcheck's worker modules once, so a
worker does not pay their import again (about 2 s of CPU; a campaign or a fuzz run restarts a worker after every
fault and hang).

A zygote is a separate single-threaded process (``python -m flashcheck._spawn``) started with the parent's
environment and ``sys.path``; it never initialises CUDA, so a forked worker sets up its own context as a fresh one
does, and it runs in a process group of its own and ignores the signals a terminal or a ``kill`` of a process group
sends (the parent stops its workers itself; the zygote ends when the parent closes its socket). Each request passes
the worker's stdin, stdout and stderr as file descriptors over a Unix socket; the worker then takes the request's
environment, working directory, ``sys.path``, process group (the parent's, or a session of its own) and the
parent's ignored signals, reseeds numpy's global generator, and runs the module as ``__main__`` with the
interpreter's own standard streams. The zygote reaps its workers and sends their exit statuses back, so `Worker`
answers ``poll``/``wait``/``kill``/``returncode`` as a `Popen` does (a signal's death is ``-signum``). Workers of
one zygote share its hash seed.

`spawn` falls back to a plain `subprocess.Popen` when forking cannot serve the request the same way: off Linux, with
``FLASHCHECK_ZYGOTE=0``, when the request's environment differs from every zygote's in anything but the variables
read only after the fork (``FLASHCHECK_*``, ``CUDA_VISIBLE_DEVICES``, pytest's ``PYTEST_*``; ``PYTHONPATH`` is
compared as where flashcheck, numpy and torch would import from), or when a zygote cannot start or fork. A parent
keeps at most `_MAX_ZYGOTES` zygotes, one per environment.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
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
from typing import IO, Any, ClassVar

__all__ = ["Worker", "spawn"]

# not FlashInfer: its import initialises CUDA (a forked worker could not use the device), nor torch's compiler
# (nothing of flashcheck's loads it: `runtime.hooks.dispatch` leaves a mode unwrapped while it is not loaded)
_PRELOAD = ("numpy", "torch", "flashcheck.isolation", "flashcheck.campaign.worker")
_SAME_ORIGIN = ("flashcheck", "numpy", "torch")  # imported in the zygote: a worker must find them where it did
_AFTER_FORK = ("FLASHCHECK_", "PYTEST_", "CUDA_VISIBLE_DEVICES", "PYTHONPATH", "PWD", "OLDPWD")
_PASSED_ON = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")  # ignored by the zygote; a worker gets the parent's
_MAX_ZYGOTES = 2
_MAX_MESSAGE = 1 << 20


def _fingerprint(env: Mapping[str, str]) -> dict[str, str]:
    """The part of `env` that preloaded modules may have read at import (everything not read after the fork)."""
    return {k: v for k, v in env.items() if not k.startswith(_AFTER_FORK)}


def _origin(name: str, path: Sequence[str]) -> str | None:
    spec = importlib.machinery.PathFinder.find_spec(name, list(path))
    return spec.origin if spec is not None else None


def _readable(fd: int, timeout: float | None) -> bool:
    poller = select.poll()  # not select.select: a parent may hold more than 1024 descriptors
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout is None else max(0, int(timeout * 1000))))


class Worker:
    """A process a zygote forked: the part of `subprocess.Popen`'s interface the supervisors use."""

    def __init__(self, pid: int, zygote: _Zygote, stdin: IO[str], stdout: IO[str]) -> None:
        self.pid = pid
        self.stdin: IO[str] | None = stdin
        self.stdout: IO[str] | None = stdout
        self.returncode: int | None = None  # set by the zygote's exit message (`_Zygote._receive`)
        self._zygote = zygote

    def poll(self) -> int | None:
        if self.returncode is None:
            self._zygote.wait_for(self, timeout=0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._zygote.wait_for(self, timeout=timeout)
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

    def __init__(self, env: Mapping[str, str], path: Sequence[str], preload: Sequence[str] = _PRELOAD) -> None:
        self.fingerprint = _fingerprint(env)
        self.origins = {name: _origin(name, path) for name in _SAME_ORIGIN}
        self.lock = threading.Lock()
        self.workers: dict[int, Worker] = {}  # running workers by pid (an exit message ends the entry)
        self.dead = False
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        start_env = dict(env)
        start_env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
        # a process group of its own (in the parent's session, so that a worker can join the parent's group):
        # signals to the parent's group are for the parent and its workers
        own_group: dict[str, Any] = {"process_group": 0} if sys.version_info >= (3, 11) else {}
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "flashcheck._spawn", str(theirs.fileno()), ",".join(preload)],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=start_env,
                **own_group,
            )
        finally:
            theirs.close()
        try:
            ready = self._receive(timeout=120.0)
        except BaseException:  # interrupted while it preloads: it has no worker yet
            self.proc.kill()
            self.close()
            raise
        if ready is None or not ready.get("ready"):
            self.close()
            raise OSError("the zygote did not start")

    def serves(self, env: Mapping[str, str], path: Sequence[str]) -> bool:
        """Whether a worker forked from this zygote starts as ``python`` with `env` and `path` would."""
        if self.dead or _fingerprint(env) != self.fingerprint:
            return False
        return all(_origin(name, path) == origin for name, origin in self.origins.items())

    def fork(self, request: dict[str, Any], fds: Sequence[int], make: Any) -> Worker:
        """Send a request; `make(pid)` builds its `Worker`, registered before any later message is read."""
        with self.lock:
            socket.send_fds(self.sock, [json.dumps(request).encode()], list(fds))
            while True:
                msg = self._receive(timeout=60.0)
                if msg is None:
                    raise OSError("the zygote did not answer")
                if "error" in msg:
                    raise OSError(f"the zygote could not fork: {msg['error']}")
                if "pid" in msg:
                    worker: Worker = make(int(msg["pid"]))
                    self.workers[worker.pid] = worker  # its exit message can only come after this reply
                    return worker

    def wait_for(self, worker: Worker, timeout: float | None) -> None:
        """Read the zygote's messages until `worker` has a return code or `timeout` seconds passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while worker.returncode is None:
            with self.lock:
                while self._receive(timeout=0.0) is not None:
                    pass
                if self.dead and worker.returncode is None:
                    worker.returncode = self._orphan_status(worker.pid)
            left = None if deadline is None else deadline - time.monotonic()
            if worker.returncode is not None or (left is not None and left <= 0):
                return
            pause = 0.05 if left is None else min(left, 0.05)
            if self.dead:
                time.sleep(pause)
            else:
                _readable(self.sock.fileno(), pause)

    @staticmethod
    def _orphan_status(pid: int) -> int | None:
        """A worker of a zygote that died: running while its process exists and is no zombie; no status is known
        once it ended (reported as killed). Its pid is no longer reserved: another process may hold it by then."""
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return -signal.SIGKILL
        return -signal.SIGKILL if state in ("Z", "X") else None

    def _receive(self, timeout: float) -> dict[str, Any] | None:
        """One message (an exit status is given to its worker first); None when none came within `timeout`."""
        if self.dead or not _readable(self.sock.fileno(), timeout):
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
            worker = self.workers.pop(int(msg["exit"]), None)
            if worker is not None:
                worker.returncode = int(msg["code"])
        return msg

    def close(self) -> None:
        self.dead = True
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)


class _Current:
    """This process's zygotes, one per environment (a forked child starts its own)."""

    zygotes: ClassVar[dict[str, _Zygote]] = {}
    failed = False  # no second try in this process: each would cost a start-up
    lock = threading.Lock()


def _forget_in_child() -> None:  # a forked parent's zygote sockets are not the child's to use
    _Current.zygotes, _Current.failed, _Current.lock = {}, False, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _zygote(env: Mapping[str, str], path: Sequence[str]) -> _Zygote | None:
    key = json.dumps(_fingerprint(env), sort_keys=True)
    with _Current.lock:
        for k, z in list(_Current.zygotes.items()):
            if z.dead:
                z.close()
                del _Current.zygotes[k]
        found = _Current.zygotes.get(key)
        if found is None and not _Current.failed and len(_Current.zygotes) < _MAX_ZYGOTES:
            try:
                found = _Current.zygotes[key] = _Zygote(env, path)
            except (OSError, ValueError):
                _Current.failed = True
        return found


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
        except (OSError, ValueError):
            pass  # the zygote went away or could not fork: start this worker the plain way
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
    request = {
        "module": module,
        "argv": list(args),
        "env": dict(env),
        "cwd": os.getcwd(),  # before the pipes: a deleted directory raises here, with nothing to close
        "path": list(path),
        "session": new_session,
        "pgid": os.getpgrp(),
        "ignored": [name for name in _PASSED_ON if signal.getsignal(getattr(signal, name)) == signal.SIG_IGN],
    }
    err = stderr.fileno() if stderr is not None else 2
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()

    def make(pid: int) -> Worker:
        stdin = open(in_w, "w", buffering=1, encoding="utf-8")  # noqa: SIM115 (the worker's pipe, closed with it)
        stdout = open(out_r, encoding="utf-8")  # noqa: SIM115
        return Worker(pid, zygote, stdin, stdout)

    try:
        worker = zygote.fork(request, [in_r, out_w, err], make)
    except BaseException:
        for fd in (in_w, out_r):
            os.close(fd)
        raise
    finally:
        os.close(in_r)
        os.close(out_w)
    return worker


# ---- the zygote process ----------------------------------------------------------------------------------------
def _serve(fd: int, preload: Sequence[str]) -> int:
    """Preload, then fork a worker per request until the parent closes its socket. Returns in the parent (0) and,
    through `_become`, in each worker (its module's run)."""
    for name in _PASSED_ON:  # the parent stops its workers itself; the zygote ends with the parent's socket
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    for name in preload:
        with contextlib.suppress(ImportError):
            __import__(name)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    try:
        sock.send(json.dumps({"ready": True}).encode())
    except OSError:
        return 0  # the parent went away while this zygote started
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    while True:
        readable = {ready for ready, _ in poller.poll()}
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
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        try:
            pid = os.fork()
        except OSError as exc:  # out of memory or processes: the parent starts this worker the plain way
            for received in fds:
                os.close(received)
            with contextlib.suppress(OSError):
                sock.send(json.dumps({"error": str(exc)}).encode())
            continue
        if pid == 0:
            signal.set_wakeup_fd(-1)
            sock.close()
            os.close(wake_r)
            os.close(wake_w)
            return _become(request, fds)
        for received in fds:
            os.close(received)
        try:
            sock.send(json.dumps({"pid": pid}).encode())
        except OSError:
            return 0  # the parent is gone; its workers run on


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
    """In a forked worker: take the request's stdio, group, directory, environment, path and ignored signals, then
    run its module as ``__main__`` (its exit, or an uncaught exception, ends the process as it would a fresh
    interpreter)."""
    import runpy

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    ignored = set(request["ignored"])
    for name in _PASSED_ON:  # as a fresh interpreter: the parent's ignored signals stay ignored, the rest default
        handler = signal.default_int_handler if name == "SIGINT" else signal.SIG_DFL
        signal.signal(getattr(signal, name), signal.SIG_IGN if name in ignored else handler)
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
    if "numpy" in sys.modules:  # each worker draws its own numbers, as each fresh interpreter does
        sys.modules["numpy"].random.seed()
    # the interpreter's own streams on fds 0-2 (its buffering, encoding and newline handling, as the zygote started
    # with the same environment)
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__
    sys.argv = [request["module"], *request["argv"]]
    # a preloaded module run as __main__ runs anew, as `python -m` runs it (its imported copy stays apart, as in a
    # fresh interpreter that imports it later)
    sys.modules.pop(str(request["module"]), None)
    runpy.run_module(str(request["module"]), run_name="__main__", alter_sys=True)
    return 0


_START_PATH = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]

if __name__ == "__main__":
    sys.exit(_serve(int(sys.argv[1]), [name for name in sys.argv[2].split(",") if name]))
