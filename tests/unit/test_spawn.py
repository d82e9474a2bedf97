"""Workers forked from the zygote (`flashcheck._spawn`) start as ``python -m`` would: the same pipes, standard
streams, environment, directory, path, arguments, exit codes, process group, ignored signals and stderr, numbers of
their own; exit statuses reach every waiter and survive a signal to the process group; and `spawn` falls back to
`subprocess.Popen` where a fork would not start the same way."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flashcheck import _spawn

pytestmark = [
    pytest.mark.skipif(not _spawn.enabled({}), reason="the zygote forks on Linux only"),
    pytest.mark.xdist_group("spawn"),  # one module-scoped zygote
]

_LIGHT = ("numpy",)  # what the probe imports (the default list adds torch: about 2 s per zygote)

PROBE = """
import json, os, signal, sys
import numpy
streams = [(s.encoding, s.errors, s.line_buffering, s.write_through) for s in (sys.stdout, sys.stderr)]
print(json.dumps({
    "argv": sys.argv[1:], "cwd": os.getcwd(), "env": os.environ.get("FLASHCHECK_PROBE_VALUE"), "main": __name__,
    "path0": sys.path[0], "pgid": os.getpgrp(), "sid": os.getsid(0), "sigint": str(signal.getsignal(signal.SIGINT)),
    "sigterm": str(signal.getsignal(signal.SIGTERM)), "stdin": [sys.stdin.encoding, sys.stdin.errors],
    "streams": streams, "draw": int(numpy.random.randint(1 << 30)),
}), flush=True)
for line in sys.stdin:
    cmd = line.strip()
    if cmd.startswith("exit "):
        sys.exit(int(cmd.split()[1]))
    if cmd == "raise":
        raise RuntimeError("probe raised")
    print("echo " + cmd, flush=True)
    print("to stderr " + cmd, file=sys.stderr, flush=True)
"""


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("probe")
    (d / "probe_mod.py").write_text(PROBE)
    return d


@pytest.fixture
def probe_env(probe_dir: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.chdir(probe_dir)
    env = dict(os.environ, FLASHCHECK_PROBE_VALUE="from the request", FLASHCHECK_ZYGOTE="1")
    env["PYTHONPATH"] = os.pathsep.join([str(probe_dir), *sys.path])
    return env


@pytest.fixture(scope="module")
def zygote(probe_dir: Path) -> Iterator[_spawn._Zygote]:
    """A zygote of this module's own (one start for its tests; the tests that kill one start their own)."""
    path = [str(probe_dir), *sys.path]
    z = _spawn._Zygote(dict(os.environ, PYTHONPATH=os.pathsep.join(path)), path, preload=_LIGHT)
    yield z
    z.close()


def _start(
    zygote: _spawn._Zygote, env: dict[str, str], *, stderr: Any = None, new_session: bool = False
) -> _spawn.Worker:
    path = env["PYTHONPATH"].split(os.pathsep)
    assert zygote.serves(env, path)
    return _spawn._fork(zygote, "probe_mod", ["a", "b c"], env=env, path=path, stderr=stderr, new_session=new_session)


def _popen(env: dict[str, str], *, new_session: bool = False) -> subprocess.Popen[str]:
    proc = _spawn.spawn("probe_mod", ["a", "b c"], env=dict(env, FLASHCHECK_ZYGOTE="0"), new_session=new_session)
    assert isinstance(proc, subprocess.Popen)
    return proc


def _seen(proc: _spawn.Worker | subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    seen: dict[str, Any] = json.loads(proc.stdout.readline())
    return seen


def _end(*procs: _spawn.Worker | subprocess.Popen[str]) -> None:
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


def test_a_forked_worker_starts_as_a_fresh_interpreter_would(zygote: _spawn._Zygote, probe_env: dict[str, str]) -> None:
    worker, other = _start(zygote, probe_env), _start(zygote, probe_env)
    plain = _popen(probe_env)
    got, want, again = _seen(worker), _seen(plain), _seen(other)
    assert got.pop("draw") != again.pop("draw")  # numpy's global generator reseeded in each worker
    want.pop("draw")
    assert got["pgid"] == want["pgid"] == os.getpgrp()  # the parent's process group, as Popen leaves it
    assert got == want and got["argv"] == ["a", "b c"] and got["env"] == "from the request"
    assert got["cwd"] == got["path0"] == os.getcwd() and got["main"] == "__main__"
    for proc in (worker, plain):
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("hello\n")
        assert proc.stdout.readline() == "echo hello\n"
        assert proc.poll() is None
        proc.stdin.write("exit 7\n")
        assert proc.wait(timeout=10) == 7 and proc.returncode == 7
    _end(worker, other, plain)


def test_exit_codes_signals_and_timeouts_read_as_popen_reads_them(
    zygote: _spawn._Zygote, probe_env: dict[str, str], tmp_path: Path
) -> None:
    err = (tmp_path / "stderr.log").open("w")
    raising = _start(zygote, probe_env, stderr=err)
    _seen(raising)
    assert raising.stdin is not None
    raising.stdin.write("raise\n")
    assert raising.wait(timeout=10) == 1  # an uncaught exception, as the interpreter exits with it
    err.close()
    assert "RuntimeError: probe raised" in (tmp_path / "stderr.log").read_text()

    killed = _start(zygote, probe_env)
    with pytest.raises(subprocess.TimeoutExpired):
        killed.wait(timeout=0.2)
    codes: list[int] = []
    waiters = [threading.Thread(target=lambda: codes.append(killed.wait(timeout=10))) for _ in range(2)]
    for t in waiters:
        t.start()
    killed.kill()
    for t in waiters:
        t.join()
    assert codes == [-signal.SIGKILL, -signal.SIGKILL]  # every waiter gets the status
    killed.kill()  # a worker that ended: nothing to signal (its pid may be another process's by now)
    assert killed.poll() == -signal.SIGKILL
    _end(raising, killed)


def test_a_session_of_its_own_and_the_parents_ignored_signals(
    zygote: _spawn._Zygote, probe_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = _start(zygote, probe_env, new_session=True)
    plain = _popen(probe_env, new_session=True)
    for proc in (worker, plain):
        seen = _seen(proc)
        assert seen["sid"] == seen["pgid"] == proc.pid
    _end(worker, plain)
    # a parent that ignores the terminal's SIGINT (a background job) passes it on, as exec does
    monkeypatch.setattr(signal, "getsignal", lambda s: signal.SIG_IGN if s == signal.SIGINT else signal.SIG_DFL)
    ignoring = _start(zygote, probe_env)
    monkeypatch.undo()
    assert _seen(ignoring)["sigint"] == str(signal.SIG_IGN)
    _end(ignoring)


def test_a_request_the_zygote_cannot_serve_the_same_way_starts_a_plain_process(
    zygote: _spawn._Zygote, probe_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = probe_env["PYTHONPATH"].split(os.pathsep)
    assert zygote.serves(dict(probe_env, CUDA_VISIBLE_DEVICES="1"), path)  # read when CUDA starts, after the fork
    for name, value in (("PYTHONHASHSEED", "3"), ("OMP_NUM_THREADS", "3"), ("TMPDIR", str(tmp_path))):
        assert not zygote.serves(dict(probe_env, **{name: value}), path), name  # read when a module starts
    shadow = tmp_path / "shadow"
    (shadow / "numpy").mkdir(parents=True)
    (shadow / "numpy" / "__init__.py").write_text("")
    assert not zygote.serves(probe_env, [str(shadow), *path])  # numpy would import from elsewhere
    (shadow / "numpy" / "__init__.py").unlink()
    (shadow / "flashcheck").mkdir()
    (shadow / "flashcheck" / "__init__.py").write_text("")  # another flashcheck (an older tree beside this one)
    assert not zygote.serves(probe_env, [str(shadow), *path])

    # this process's zygotes: the module's one only, and no room for another
    key = json.dumps(_spawn._fingerprint(probe_env), sort_keys=True)
    monkeypatch.setattr(_spawn._Current, "zygotes", {key: zygote})
    monkeypatch.setattr(_spawn, "_MAX_ZYGOTES", 1)
    forked = _spawn.spawn("probe_mod", [], env=probe_env)
    other_env = _spawn.spawn("probe_mod", [], env=dict(probe_env, PYTHONHASHSEED="3"))
    switched_off = _spawn.spawn("probe_mod", [], env=dict(probe_env, FLASHCHECK_ZYGOTE="0"))
    assert isinstance(forked, _spawn.Worker)
    assert isinstance(other_env, subprocess.Popen) and isinstance(switched_off, subprocess.Popen)
    _end(forked, other_env, switched_off)


def test_a_signal_to_the_process_group_leaves_the_zygote_and_its_statuses(probe_env: dict[str, str]) -> None:
    zygote = _spawn._Zygote(probe_env, probe_env["PYTHONPATH"].split(os.pathsep), preload=_LIGHT)
    worker = _start(zygote, probe_env)
    _seen(worker)
    zygote.proc.send_signal(signal.SIGTERM)  # as `kill -TERM -PGID` or `timeout` sends it: the parent stops workers
    zygote.proc.send_signal(signal.SIGINT)
    assert worker.stdin is not None
    worker.stdin.write("exit 3\n")
    assert worker.wait(timeout=10) == 3 and zygote.proc.poll() is None
    _end(worker)
    zygote.close()


def test_workers_outlive_their_zygote_and_still_read_as_running_then_ended(probe_env: dict[str, str]) -> None:
    zygote = _spawn._Zygote(probe_env, probe_env["PYTHONPATH"].split(os.pathsep), preload=_LIGHT)
    worker = _start(zygote, probe_env)
    _seen(worker)
    zygote.proc.kill()
    zygote.proc.wait()
    assert worker.poll() is None and zygote.dead
    assert worker.stdin is not None and worker.stdout is not None
    worker.stdin.write("again\n")
    assert worker.stdout.readline() == "echo again\n"  # the worker runs on
    worker.kill()
    assert worker.wait(timeout=10) == -signal.SIGKILL  # ended; its status went with the zygote
    with pytest.raises(OSError):
        _spawn._fork(zygote, "probe_mod", [], env=probe_env, path=[], stderr=None, new_session=False)
    _end(worker)
    zygote.close()
