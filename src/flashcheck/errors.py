"""The one exception hierarchy of flashcheck.

`FlashcheckError` is the root. Its branches separate "you called us wrong" (`UsageError`: `InvalidArgument`,
`InvalidDefinition`) from "we found a bug" (`ViolationFound`), from "this machine cannot run that"
(`EnvironmentUnavailable`, which test integrations turn into a skip, never a failure) and from "a fault reported
earlier left this process unable to run more steps" (`ContextPoisoned`: restart the process and go on).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flashcheck.findings import Finding

__all__ = [
    "ContextPoisoned",
    "EnvironmentUnavailable",
    "FlashcheckError",
    "InvalidArgument",
    "InvalidDefinition",
    "UsageError",
    "ViolationFound",
]


class FlashcheckError(Exception):
    """Root of every exception flashcheck raises on purpose."""


class UsageError(FlashcheckError):
    """The caller used flashcheck wrongly; the message says what was wrong and what to do."""


class InvalidArgument(UsageError, ValueError):
    """An argument has a bad value: the message names the argument, the value and the accepted range."""


class InvalidDefinition(UsageError, TypeError):
    """A target, property or check definition is malformed (missing method, wrong signature, bad ID...)."""


class EnvironmentUnavailable(FlashcheckError):
    """The environment cannot run this (no CUDA device, no FlashInfer, unsupported architecture).

    Test integrations turn it into a skip with `reason` as the message; it is never a failure.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ContextPoisoned(FlashcheckError):
    """A kernel fault or a hang, already reported as a finding, left this process's CUDA context unusable.

    It is never a verdict: whoever drives the session restarts the process (a fresh worker) and goes on.
    """


class ViolationFound(FlashcheckError, AssertionError):
    """A check found at least one violation. `findings` holds every one of them."""

    def __init__(self, findings: Sequence[Finding]) -> None:
        self.findings: tuple[Finding, ...] = tuple(findings)
        head = "\n".join(f"  {f.id} {f.name}: {f.message}" for f in self.findings[:10])
        more = f"\n  ... and {len(self.findings) - 10} more" if len(self.findings) > 10 else ""
        super().__init__(f"{len(self.findings)} finding(s):\n{head}{more}")


def require(condition: bool, message: str) -> None:
    """Raise `InvalidArgument(message)` unless `condition` holds (`assert` is stripped under -O)."""
    if not condition:
        raise InvalidArgument(message)


# The exit-code contract of every `flashcheck` subcommand (documented in `flashcheck.cli`); here so that the layers
# below the command line (campaign supervisor, workers) return the same codes without importing it.
EXIT_CLEAN, EXIT_FINDINGS, EXIT_USAGE, EXIT_ENV, EXIT_INCOMPLETE, EXIT_INTERNAL = 0, 1, 2, 3, 4, 5
EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 130, 141
