"""Workers forked from the zygote (`flashcheck._spawn`) start as ``python -m`` would: the same pipes, environment,
directory, path, arguments, exit codes, process group and stderr; and `spawn` falls back to `subprocess.Popen`
where a fork would not start the same way."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flashcheck import _spawn

pytestmark = [
    pytest.mark.skipif(not _spawn.enabled({}), reason="the zygote forks on Linux only"),
    pytest.mark.xdist_group("spawn"),  # one module-scoped zygote
]

PROBE = """
import json, os, sys
print(json.dumps({
    "argv": sys.argv[1:], "cwd": os.getcwd(), "env": os.environ.get("PROBE_VALUE"), "main": __name__,
    "numpy_loaded": "numpy" in sys.modules, "path0": sys.path[0], "pgid": os.getpgrp(), "sid": os.getsid(0),
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
    env = dict(os.environ, PROBE_VALUE="from the request", FLASHCHECK_ZYGOTE="1")
    env["PYTHONPATH"] = os.pathsep.join([str(probe_dir), *sys.path])
    return env


@pytest.fixture(scope="module")
def zygote(probe_dir: Path) -> Iterator[_spawn._Zygote]:
    """A zygote of this module's own (one start for its tests; the test that kills one starts another)."""
    path = [str(probe_dir), *sys.path]
    z = _spawn._Zygote(dict(os.environ, PYTHONPATH=os.pathsep.join(path)), path)
    yield z
    z.close()


def _start(
    zygote: _spawn._Zygote, env: dict[str, str], *, stderr: object = None, new_session: bool = False
) -> _spawn.Worker:
    path = env["PYTHONPATH"].split(os.pathsep)
    return _spawn._fork(zygote, "probe_mod", ["a", "b c"], env=env, path=path, stderr=stderr, new_session=new_session)  # type: ignore[arg-type]


def _popen(env: dict[str, str], *, new_session: bool = False) -> subprocess.Popen[str]:
    plain = dict(env, FLASHCHECK_ZYGOTE="0")
    proc = _spawn.spawn("probe_mod", ["a", "b c"], env=plain, new_session=new_session)
    assert isinstance(proc, subprocess.Popen)
    return proc


def test_a_forked_worker_starts_as_a_fresh_interpreter_would(zygote: _spawn._Zygote, probe_env: dict[str, str]) -> None:
    worker = _start(zygote, probe_env)
    plain = _popen(probe_env)
    assert worker.stdout is not None and plain.stdout is not None
    got, want = json.loads(worker.stdout.readline()), json.loads(plain.stdout.readline())
    assert got.pop("numpy_loaded") is True  # forked after the zygote imported it
    want.pop("numpy_loaded")
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
    plain.stdin.close()  # type: ignore[union-attr]
    plain.stdout.close()


def test_exit_codes_signals_and_timeouts_read_as_popen_reads_them(
    zygote: _spawn._Zygote, probe_env: dict[str, str], tmp_path: Path
) -> None:
    err = (tmp_path / "stderr.log").open("w")
    raising = _start(zygote, probe_env, stderr=err)
    assert raising.stdin is not None and raising.stdout is not None
    raising.stdout.readline()
    raising.stdin.write("raise\n")
    assert raising.wait(timeout=10) == 1  # an uncaught exception, as the interpreter exits with it
    err.close()
    assert "RuntimeError: probe raised" in (tmp_path / "stderr.log").read_text()

    killed = _start(zygote, probe_env)
    with pytest.raises(subprocess.TimeoutExpired):
        killed.wait(timeout=0.2)
    killed.kill()
    assert killed.wait(timeout=10) == -signal.SIGKILL
    killed.kill()  # a worker that ended: nothing to signal (its pid may be another process's by now)
    assert killed.poll() == -signal.SIGKILL


def test_a_session_of_its_own_leaves_the_terminals_signals_to_the_parent(
    zygote: _spawn._Zygote, probe_env: dict[str, str]
) -> None:
    worker = _start(zygote, probe_env, new_session=True)
    plain = _popen(probe_env, new_session=True)
    for proc in (worker, plain):
        assert proc.stdout is not None
        seen = json.loads(proc.stdout.readline())
        assert seen["sid"] == seen["pgid"] == proc.pid
        proc.kill()
        proc.wait(timeout=10)
    plain.stdin.close()  # type: ignore[union-attr]
    plain.stdout.close()  # type: ignore[union-attr]


def test_a_request_the_zygote_cannot_serve_the_same_way_starts_a_plain_process(
    zygote: _spawn._Zygote, probe_env: dict[str, str], tmp_path: Path
) -> None:
    path = probe_env["PYTHONPATH"].split(os.pathsep)
    assert zygote.serves(probe_env, path)
    assert zygote.serves(dict(probe_env, CUDA_VISIBLE_DEVICES="1"), path)  # read when CUDA starts, after the fork
    assert not zygote.serves(dict(probe_env, PYTHONHASHSEED="3"), path)  # read when the interpreter starts
    assert not zygote.serves(dict(probe_env, OMP_NUM_THREADS="3"), path)
    shadow = tmp_path / "shadow"
    (shadow / "numpy").mkdir(parents=True)
    (shadow / "numpy" / "__init__.py").write_text("")
    assert not zygote.serves(probe_env, [str(shadow), *path])  # numpy would import from elsewhere
    (shadow / "numpy" / "__init__.py").unlink()
    (shadow / "flashcheck").mkdir()
    (shadow / "flashcheck" / "__init__.py").write_text("")  # another flashcheck (an older tree beside this one)
    assert not zygote.serves(probe_env, [str(shadow), *path])
    first = _spawn.spawn("probe_mod", [], env=probe_env)  # starts this process's zygote (or finds it)
    proc = _spawn.spawn("probe_mod", [], env=dict(probe_env, PYTHONHASHSEED="3"))
    assert isinstance(first, _spawn.Worker) and isinstance(proc, subprocess.Popen)
    for p in (first, proc):
        p.kill()
        p.wait(timeout=10)
        p.stdin.close()  # type: ignore[union-attr]
        p.stdout.close()  # type: ignore[union-attr]


def test_workers_outlive_their_zygote_and_still_read_as_running_then_ended(probe_env: dict[str, str]) -> None:
    zygote = _spawn._Zygote(probe_env, probe_env["PYTHONPATH"].split(os.pathsep))
    worker = _start(zygote, probe_env)
    assert worker.stdout is not None and worker.stdin is not None
    worker.stdout.readline()
    zygote.proc.kill()
    zygote.proc.wait()
    assert worker.poll() is None and zygote.dead
    worker.stdin.write("again\n")
    assert worker.stdout.readline() == "echo again\n"  # the worker runs on
    worker.kill()
    assert worker.wait(timeout=10) == -signal.SIGKILL  # ended; its status went with the zygote
    with pytest.raises(OSError):
        _start(zygote, probe_env)
    zygote.close()
