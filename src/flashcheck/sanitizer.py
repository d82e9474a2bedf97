"""Re-run a reproducer under NVIDIA compute-sanitizer (``flashcheck replay FILE --sanitizer memcheck``) to name the
kernel and the address behind a fault; the tool ships with the CUDA toolkit. No torch here: the replay itself runs in
a child process under the sanitizer.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from flashcheck.errors import EnvironmentUnavailable, InvalidArgument

__all__ = ["SANITIZER_TOOLS", "SanitizerReport", "find_sanitizer", "parse_report", "run_under_sanitizer"]

SANITIZER_TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
_ERROR = re.compile(r"^=+ (?P<what>(Invalid|Out-of-range|Uninitialized|Race|Barrier|Misaligned|Warning|Error)[^\n]*)")
_AT = re.compile(r"^=+\s+at (?P<where>.+?)(\+0x[0-9a-f]+)?( in (?P<file>\S+))?$")
_ADDRESS = re.compile(r"^=+\s+(?P<addr>Address 0x[0-9a-f]+.*)$")
_SUMMARY = re.compile(r"ERROR SUMMARY: (?P<n>\d+) error")


@dataclass(frozen=True)
class SanitizerReport:
    """What compute-sanitizer said: each error with the kernel it names and the address line that follows it (empty
    when the tool printed none), and its summary count."""

    errors: tuple[tuple[str, str, str], ...]  # (what happened, kernel or function, address)
    count: int
    output: str

    def distinct(self) -> list[tuple[str, str, str, int]]:
        """Each distinct (what happened, where) once with its first address and how many times it was printed, most
        frequent first (one bad index read by every thread prints thousands of identical lines)."""
        first: dict[tuple[str, str], str] = {}
        seen: dict[tuple[str, str], int] = {}
        for what, where, addr in self.errors:
            first.setdefault((what, where), addr)
            seen[(what, where)] = seen.get((what, where), 0) + 1
        return [(w, k, first[(w, k)], n) for (w, k), n in sorted(seen.items(), key=lambda kv: -kv[1])]


def find_sanitizer() -> str:
    """The compute-sanitizer executable, or `EnvironmentUnavailable` naming where it was looked for."""
    candidates = [shutil.which("compute-sanitizer")]
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root:
            candidates.append(str(Path(root) / "bin" / "compute-sanitizer"))
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    raise EnvironmentUnavailable(
        "compute-sanitizer not found on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin: install the CUDA toolkit"
    )


def parse_report(output: str) -> SanitizerReport:
    """The errors compute-sanitizer printed, each paired with the first ``at`` line after it and the ``Address``
    line that follows before the next error."""
    errors: list[list[str]] = []
    pending: str | None = None
    for line in output.splitlines():
        m = _ERROR.match(line)
        if m is not None and "ERROR SUMMARY" not in line:
            pending = m.group("what").strip()
            continue
        a = _AT.match(line)
        if a is not None and pending is not None:
            errors.append([pending, a.group("where").strip(), ""])
            pending = None
            continue
        d = _ADDRESS.match(line)
        if d is not None and errors and not errors[-1][2]:
            errors[-1][2] = d.group("addr").strip()
    s = _SUMMARY.search(output)
    found = tuple((w, k, d) for w, k, d in errors)
    return SanitizerReport(found, int(s.group("n")) if s else len(found), output)


def run_under_sanitizer(file: str, tool: str, *, device: str | None = None, timeout: float = 1800.0) -> SanitizerReport:
    """Replay reproducer `file` in a child process under ``compute-sanitizer --tool TOOL`` (in process: the
    sanitizer must see the kernels) and parse what it reports."""
    if tool not in SANITIZER_TOOLS:
        raise InvalidArgument(f"--sanitizer {tool!r}: choose one of {', '.join(SANITIZER_TOOLS)}")
    exe = find_sanitizer()
    cmd = [
        exe,
        "--tool",
        tool,
        "--print-limit",
        "20",
        sys.executable,
        "-m",
        "flashcheck",
        "replay",
        file,
        "--no-snippet",
    ]
    if device:
        cmd += ["--device", device]
    env = dict(os.environ, FLASHCHECK_REPLAY_IN_PROCESS="1", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return parse_report(out + f"\n(compute-sanitizer did not finish in {timeout:g}s)")
    return parse_report(proc.stdout + proc.stderr)
