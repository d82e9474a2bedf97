"""One table that classifies what a target (FlashInfer or a user backend) raises.

- ``rejected``: the backend refused the input on purpose (a contract `ValueError`); not a finding, the step is
  skipped and counted.
- ``finding``: a bug: an illegal memory access, a device-side assert, a workspace overflow, an unexpected error.
- ``environment``: the machine cannot run it (no kernel for this architecture, JIT disabled, no nvcc); skip.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass
from typing import Literal

from flashcheck.findings import Finding, Frame, Location
from flashcheck.registry import register_check

__all__ = ["ERROR_TABLE", "TARGET_ERROR_ID", "Classification", "classify_exception", "finding_from_exception"]

TARGET_ERROR_ID, TARGET_ERROR_NAME = "FC250", "target-raised"
Verdict = Literal["rejected", "finding", "environment"]


@dataclass(frozen=True)
class Classification:
    verdict: Verdict
    check_id: str | None  # the check a finding is reported under
    reason: str


# (verdict, check id, exception type names or None for any, message regex, reason). First match wins.
ERROR_TABLE: tuple[tuple[Verdict, str | None, tuple[str, ...] | None, str, str], ...] = (
    (
        "finding",
        "FC302",
        None,
        r"Buffer overflow when allocating memory|exceeds max buffer size|"
        r"exceeds max_total_num_works",
        "workspace sized too small for this batch (FlashInfer planner overflow)",
    ),
    (
        "finding",
        "FC250",
        None,
        r"illegal memory access|device-side assert|misaligned address|"
        r"unspecified launch failure|illegal instruction",
        "the kernel faulted: the CUDA context is poisoned",
    ),
    (
        "environment",
        None,
        None,
        r"no kernel image is available|not supported on (this|current) (device|GPU)|"
        r"MissingJITCacheError|requires (SM|sm_?)\d+|is only supported on SM|nvcc.*not found|CUDA_HOME",
        "the kernel is not available on this machine",
    ),
    (
        "environment",
        None,
        None,
        r"Ninja build failed|Error building extension|error: command .*nvcc.* failed",
        "the kernel could not be JIT-compiled on this machine (compiler error, killed or out of memory): "
        "prebuild it (flashinfer-jit-cache) or retry with fewer parallel compile jobs (MAX_JOBS)",
    ),
    (
        "environment",
        None,
        ("MissingJITCacheError", "NotImplementedError"),
        r".*",
        "the backend does not implement this configuration",
    ),
    (
        "rejected",
        None,
        ("ValueError",),
        r"cuda ?graph mode|cannot exceed the number of rows|batch size|"
        r"should be a torch\.Tensor|must be|should be|expected|mismatch|not supported",
        "the backend rejected the input by contract",
    ),
)


@register_check(TARGET_ERROR_ID, TARGET_ERROR_NAME, "runtime")
class _TargetErrorDoc:
    """The code under test raised an error that is not a documented rejection of the input.

    What it checks
        Every exception a target raises is classified by one table (`flashcheck.targets.classify.ERROR_TABLE`):
        contract rejections (FlashInfer's ``ValueError`` for a fixed graph batch size) are skipped; a missing
        kernel or architecture is the environment (skip); an illegal memory access, a device-side assert or an
        unexpected exception is this finding, with the traceback as its stack.

    Why it breaks serving
        An illegal memory access poisons the CUDA context: every later request on that GPU fails until the process
        restarts. An unexpected exception in metadata building takes down the scheduler step.

    Example
        A metadata builder indexing a block table with a padded row's stale request id::

            kv_indices[...] = block_table[req_pool_indices[i], : num_pages[i]]   # IndexError for padding rows

    Use instead
        Validate the batch before building metadata (FC301), pad with a valid policy, and keep the kernel's inputs
        inside the buffers it was given.

    Known false positives
        A backend that signals rejection with a type other than ``ValueError`` is reported here; add its message
        to the table or wrap it in ``ValueError``.
    """


def classify_exception(exc: BaseException) -> Classification:
    """Look `exc` up in `ERROR_TABLE`; unknown errors are findings (FC250)."""
    names = {t.__name__ for t in type(exc).__mro__}
    text = f"{type(exc).__name__}: {exc}"
    for verdict, check_id, types, pattern, reason in ERROR_TABLE:
        if types is not None and not names.intersection(types):
            continue
        if re.search(pattern, text, re.IGNORECASE):
            return Classification(verdict, check_id, reason)
    return Classification("finding", TARGET_ERROR_ID, "unexpected exception from the target")


def finding_from_exception(exc: BaseException, cls: Classification, location: Location) -> Finding:
    """A finding for an exception classified as a bug (FC302 for overflows, FC250 otherwise)."""
    frames = tuple(
        Frame(fs.filename, fs.lineno or 0, fs.name, (fs.line or "").strip())
        for fs in traceback.extract_tb(exc.__traceback__)
    )
    check_id = cls.check_id or TARGET_ERROR_ID
    name = "workspace-within-bounds" if check_id == "FC302" else TARGET_ERROR_NAME
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return Finding(
        id=check_id,
        name=name,
        kind="runtime" if check_id == TARGET_ERROR_ID else "property",
        message=f"{type(exc).__name__}: {first_line[:400]}",
        location=location,
        stack=frames,
        hint=cls.reason,
        evidence={"check": "exception", "type": type(exc).__name__, "verdict": cls.verdict},
    )
