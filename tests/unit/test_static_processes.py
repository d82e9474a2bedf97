"""The processes of `flashcheck static`: with more than one job the model is built in a forked child and FC101 runs
in a forked process of its own, and the findings are those of one process; a child's result, exception or death
comes back to the caller (`flashcheck.verifier.isolated`). Forks are tested in child interpreters: a test worker
may run threads, and then nothing forks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_static_cache import SRC, engine, findings

_RUN = """
import json, sys
from pathlib import Path
from flashcheck.verifier import StaticConfig, check_paths, load_config
p = Path(sys.argv[1])
config = load_config(p / "pyproject.toml") if (p / "pyproject.toml").is_file() else StaticConfig(root=str(p))
r = check_paths([str(p)], config.with_overrides(jobs=int(sys.argv[2])))
assert r.internal_errors == [], r.internal_errors
print(json.dumps([
    (f.id, f.location.file, f.location.line, f.location.column, f.location.function, f.message, f.confidence.value,
     json.dumps(f.evidence, sort_keys=True, default=str), [(s.file, s.line, s.function, s.code) for s in f.stack])
    for f in r.findings
]))
"""


def _child(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, check=False)


@pytest.mark.parametrize("name", ["engine_vllm", "engine_sglang"])
def test_forked_runs_find_what_one_process_finds(tmp_path: Path, name: str) -> None:
    project = engine(tmp_path, name)
    plain = json.loads(json.dumps(findings(project, jobs=1)))
    assert any(f[0] == "FC101" for f in plain) and any(f[0] != "FC101" for f in plain), "both groups find something"
    for jobs in ("1", "2"):
        out = _child(_RUN, str(project), jobs)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == plain


_ISOLATED = """
import os
from flashcheck.verifier.isolated import IsolatedError, can_fork, run_isolated, start_isolated
assert can_fork()
assert run_isolated(lambda: {"answer": [42]}) == {"answer": [42]}
pending = start_isolated(lambda: os.getpid())
assert pending.result() != os.getpid()
pending.cancel()  # reaped already: nothing happens
def fail():
    raise ValueError("no")
try:
    run_isolated(fail)
except ValueError as exc:
    assert str(exc) == "no"
class Odd(Exception):
    def __init__(self, a, b):
        super().__init__(a)
def odd():
    raise Odd(1, 2)
try:
    run_isolated(odd)
except IsolatedError as exc:
    assert "Odd" in str(exc)
try:
    run_isolated(lambda: os._exit(3))
except IsolatedError as exc:
    assert "exit status 3" in str(exc)
print("ok")
"""


def test_a_child_gives_back_its_result_its_exception_or_its_death() -> None:
    out = _child(_ISOLATED)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
