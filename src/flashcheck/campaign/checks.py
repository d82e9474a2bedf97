"""FC251 worker-crashed: a campaign worker died (signal, fatal exit, hang past the step timeout) mid-scenario."""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flashcheck.check import Check
from flashcheck.findings import Finding, Location

__all__ = ["WORKER_CRASHED", "campaign_checks", "crash_cause", "crash_finding", "stderr_tail"]

WORKER_CRASHED = Check(
    "FC251",
    "worker-crashed",
    "runtime",
    doc="""\
    A campaign worker process died, or hung, while running a scenario step.

    What it checks
        Every campaign worker writes the scenario it is about to run to ``RUN_DIR/workers/W/inflight.json`` before
        running it and reports each finished step. When the process dies from a signal (SIGSEGV, SIGABRT, SIGKILL
        from the OOM killer), exits without being asked to, or makes no progress for longer than
        ``--step-timeout``, the supervisor records this finding with the in-flight scenario cut after the step
        that never finished, restarts the worker and carries on. Crashes are grouped by cause and step kind
        (``evidence["check"]``, e.g. ``signal SIGSEGV``, ``exit 3``, ``hang``) per target; each group keeps its
        smallest reproducer (fewest steps, then fewest tokens).

    Why it breaks serving
        A kernel that faults hard (an illegal address that aborts the process, a device-side assert with
        ``CUDA_LAUNCH_BLOCKING``, a deadlock in a graph replay) takes down the serving process and every request
        on that GPU, not just the batch that triggered it.

    Example
        A metadata builder writes ``kv_indices`` past the persistent buffer for one padded batch shape; the
        replayed graph reads garbage page ids and the process dies with SIGSEGV (or hangs in the kernel)::

            kv_indices[: total_pages + pad] = ...      # no bound against the buffer the graph captured

    Use instead
        Validate the batch against the captured buffers before replay (FC301), size persistent buffers for the
        largest bucket, and reproduce with the saved reproducer to find the first bad step. A known crasher can
        be skipped with a quarantine ledger entry that cites its reason (``--ledger``).

    Known false positives
        The machine itself can kill a worker (OOM killer, a preempted node, an operator's ``kill``); the evidence
        carries the exit status and the tail of the worker's stderr to tell them apart. A step that is merely
        slow (a JIT compile on first use) is reported as a hang when ``--step-timeout`` is too short.
    """,
)


def crash_cause(returncode: int | None, hung: bool) -> str:
    """``signal SIGSEGV``, ``exit 3`` or ``hang`` from a worker's exit status."""
    if hung:
        return "hang"
    if returncode is None:
        return "unknown"
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit {returncode}"


def crash_finding(
    *,
    target: str,
    step_index: int,
    step_name: str,
    op: str,
    cause: str,
    evidence: Mapping[str, Any],
    timeout: float | None = None,
) -> Finding:
    """The FC251 finding for a worker that died at `step_index` of its in-flight scenario."""
    how = f"made no progress for {timeout:g}s" if cause == "hang" and timeout else f"died ({cause})"
    return WORKER_CRASHED.finding(
        f"the campaign worker {how} while running step {step_index} ({step_name}) of its scenario",
        hint="replay the reproducer in a fresh process; quarantine it with a --ledger entry citing a reason "
        "if it is a known crasher",
        location=Location(target=target, step=step_index, step_name=step_name),
        evidence={"check": cause, "op": op, **dict(evidence)},
    )


def stderr_tail(log: Path, lines: int = 12) -> str:
    """The last `lines` lines of a worker's stderr log (its last 4 KiB), for a crash finding's evidence."""
    try:
        data = log.read_bytes()[-4096:]
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


def campaign_checks(layers: str, select: Sequence[str] = (), *, cuda: bool = False) -> list[str]:
    """The check IDs a campaign runs and reports (``run.json`` ``"checks"``, what a clean report lists as passed):
    those its workers run at `layers` (on CUDA workers when `cuda`) with their step watchdog and FC251, narrowed to
    `select` when given (the supervisor drops every other check's findings; FC251 is always reported)."""
    from flashcheck.driver import checks_run  # imported here: the supervisor side imports no torch

    ids = checks_run(layers, watchdog=True, campaign=True, cuda=cuda)
    return [c for c in ids if not select or c in select or c == WORKER_CRASHED.id]
