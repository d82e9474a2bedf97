"""One table that classifies what a target (FlashInfer or a user backend) raises, by cause.

The driver only hands a target steps inside its declared `Capacity` (and its explicit input contract, if it
declares one), so an exception from a target is never a skip:

- ``finding``: a bug. A kernel fault (illegal memory access, device-side assert, ...) is FC250 and *poisons the CUDA
  context* (`Classification.poisons_context`): nothing else can run in that process. A planner overflow is FC302.
  Any other exception, a backend's ``ValueError`` included, is FC250 "raised on valid input": in production it kills
  the engine.
- ``environment``: the machine cannot run it, for an explicit cause only (no kernel image for this architecture,
  JIT disabled or failing to build, no compiler, a configuration the backend does not implement). Never after a
  fault: the driver reports every error that follows a poisoned context as part of the fault.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass
from typing import Literal

from flashcheck.check import Check
from flashcheck.findings import Finding, Frame, Location
from flashcheck.runtime.checks.workspace import WORKSPACE_WITHIN_BOUNDS

__all__ = [
    "ERROR_TABLE",
    "TARGET_RAISED",
    "Classification",
    "classify_exception",
    "finding_from_exception",
    "is_device_fault",
]

Verdict = Literal["finding", "environment"]

TARGET_RAISED = Check(
    "FC250",
    "target-raised",
    "runtime",
    doc="""\
    The code under test raised, or a kernel it launched faulted, on a step inside its declared capacity.

    What it checks
        Every exception a target raises, and every CUDA error its kernels cause wherever it surfaces (inside the
        target call, at the driver's synchronize inside the call's error boundary, or later in flashcheck's own
        reads), is classified by one table (`flashcheck.targets.classify.ERROR_TABLE`). A kernel fault (illegal
        memory access, device-side assert, misaligned address, launch failure) is this finding and poisons the
        CUDA context: the driver stops the session, and the plugin, ``flashcheck fuzz`` and campaigns restart the
        process and go on. Any other exception on a valid step, a backend's ``ValueError`` included, is this finding
        ("raised on valid input"). Only an explicit environment cause (no kernel image, a JIT build failure, a
        missing package, an unimplemented configuration) skips the target instead.

    Why it breaks serving
        An illegal memory access poisons the CUDA context: every later request on that GPU fails until the process
        restarts. An exception in metadata building or in ``plan()`` on a batch the engine itself produced kills the
        scheduler step, and with it the engine: FlashInfer's "The batch size should be fixed in cudagraph mode"
        means the engine re-planned a graph wrapper with the real batch instead of its bucket.

    Example
        A metadata builder indexing a block table with a padded row's stale request id::

            kv_indices[...] = block_table[req_pool_indices[i], : num_pages[i]]   # IndexError for padding rows

        A graph replayed on the plan of its capture (no re-plan before replay) faults::

            RuntimeError: CUDA error: an illegal memory access was encountered

    Use instead
        Validate the batch before building metadata (FC301), pad with a valid policy, re-plan every graph wrapper
        with its bucket's padded batch before each replay, and keep the kernel's inputs inside the buffers it was
        given. Reproduce a fault under ``flashcheck replay REPRO --sanitizer memcheck`` to name the kernel and the
        address.

    Known false positives
        A target that cannot handle part of its declared capacity is reported here: declare the limit in its
        `Capacity`, or an explicit input contract (`Target.accepts`), so the generator stays inside it.
    """,
)


@dataclass(frozen=True)
class Classification:
    verdict: Verdict
    check: Check | None  # the check a finding is reported under (None: not a finding)
    reason: str
    poisons_context: bool = False  # the CUDA context is unusable: restart the process before the next step

    @property
    def check_id(self) -> str | None:
        return None if self.check is None else self.check.id


_FAULT = (
    r"illegal memory access|device-side assert|misaligned address|unspecified launch failure|illegal instruction|"
    r"an illegal instruction|CUDA error: (?!out of memory|no kernel image)|CUBLAS_STATUS_EXECUTION_FAILED|"
    r"cudaErrorLaunchFailure|"
    r"hardware stack error|uncorrectable ECC"
)

# (verdict, check, exception type names or None for any, message regex, reason, poisons context). First match wins.
ERROR_TABLE: tuple[tuple[Verdict, Check | None, tuple[str, ...] | None, str, str, bool], ...] = (
    (
        "finding",
        TARGET_RAISED,
        None,
        _FAULT,
        "the kernel faulted: the CUDA context is poisoned (every later CUDA call in this process fails)",
        True,
    ),
    (
        "finding",
        WORKSPACE_WITHIN_BOUNDS,
        None,
        r"Buffer overflow when allocating memory|exceeds max buffer size|exceeds max_total_num_works",
        "workspace sized too small for this batch (FlashInfer planner overflow)",
        False,
    ),
    (
        "environment",
        None,
        None,
        r"no kernel image is available|not supported on (this|current) (device|GPU)|"
        r"MissingJITCacheError|requires (SM|sm_?)\d+|is only supported on SM|nvcc.*not found|CUDA_HOME",
        "the kernel is not available on this machine",
        False,
    ),
    (
        "environment",
        None,
        None,
        r"Ninja build failed|Error building extension|error: command .*nvcc.* failed",
        "the kernel could not be JIT-compiled on this machine (compiler error, killed or out of memory): "
        "prebuild it (flashinfer-jit-cache) or retry with fewer parallel compile jobs (MAX_JOBS)",
        False,
    ),
    (
        "environment",
        None,
        ("MissingJITCacheError", "NotImplementedError", "ModuleNotFoundError"),
        r".*",
        "the backend does not implement this configuration, or a package it needs is missing",
        False,
    ),
)


def classify_exception(exc: BaseException) -> Classification:
    """Look `exc` up in `ERROR_TABLE`; anything else is a finding (FC250, raised on valid input)."""
    names = {t.__name__ for t in type(exc).__mro__}
    text = f"{type(exc).__name__}: {exc}"
    for verdict, check, types, pattern, reason, poisons in ERROR_TABLE:
        if types is not None and not names.intersection(types):
            continue
        if re.search(pattern, text, re.IGNORECASE):
            return Classification(verdict, check, reason, poisons)
    return Classification("finding", TARGET_RAISED, "raised on valid input (the step is inside the target's capacity)")


def is_device_fault(exc: BaseException) -> bool:
    """Whether `exc` is a kernel fault that poisons the CUDA context (wherever it surfaced)."""
    return classify_exception(exc).poisons_context


def finding_from_exception(exc: BaseException, cls: Classification, location: Location) -> Finding:
    """A finding for an exception classified as a bug (FC302 for overflows, FC250 otherwise)."""
    frames = tuple(
        Frame(fs.filename, fs.lineno or 0, fs.name, (fs.line or "").strip())
        for fs in traceback.extract_tb(exc.__traceback__)
    )
    check = cls.check or TARGET_RAISED
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return check.finding(
        f"{type(exc).__name__}: {first_line[:400]}",
        location=location,
        stack=frames,
        hint=cls.reason,
        evidence={"check": "exception", "type": type(exc).__name__, "verdict": cls.verdict},
    )
