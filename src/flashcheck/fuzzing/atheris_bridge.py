"""Coverage-guided fuzzing of the same tests with atheris, through Hypothesis' ``fuzz_one_input``.

Hypothesis decodes atheris' bytes into the test's own strategies, so a ``@given`` test (e.g.
`flashcheck.fuzzing.metadata.metadata_builder_test` over your host-side metadata builder) or a ``@flashcheck.fuzz``
test runs unchanged; failures are saved in the test's Hypothesis example database, so the next ordinary pytest run
replays, shrinks and reports them. atheris is optional: ``pip install flashcheck[fuzz]``.

Run in its own process (libFuzzer exits the process when done)::

    from flashcheck.fuzzing.atheris_bridge import run_atheris
    from flashcheck.fuzzing.metadata import metadata_builder_test
    from mypkg.metadata import build           # your builder

    if __name__ == "__main__":
        run_atheris(metadata_builder_test(build), instrument=[build], argv=["-runs=100000"])
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from flashcheck.errors import EnvironmentUnavailable, InvalidArgument

__all__ = ["fuzz_one_input", "load_atheris", "run_atheris"]

FuzzInput = Callable[[bytes], Any]


def load_atheris() -> ModuleType:
    """Import atheris or raise `EnvironmentUnavailable` saying how to install it."""
    try:
        import atheris
    except ImportError:
        raise EnvironmentUnavailable(
            "atheris is not installed: pip install 'flashcheck[fuzz]' (needs Linux or macOS and a CPython wheel)"
        ) from None
    return atheris  # type: ignore[no-any-return]


def fuzz_one_input(test: Callable[..., Any]) -> FuzzInput:
    """The ``bytes -> None`` entry point of a ``@given`` test or a ``@flashcheck.fuzz`` test.

    Returns Hypothesis' ``fuzz_one_input``: invalid inputs return quietly, a failing input is saved in the example
    database and its exception re-raised (atheris then records the crash).
    """
    runner = getattr(test, "fuzz_test", None)
    if runner is not None:  # a @flashcheck.fuzz test: the state machine as a @given test
        from hypothesis.stateful import get_state_machine_test

        from flashcheck.fuzzing.options import PROFILES
        from flashcheck.fuzzing.stateful import machine_settings

        machine = runner.machine()
        test = get_state_machine_test(machine, settings=machine_settings("ci", PROFILES["ci"].examples))
    hyp = getattr(test, "hypothesis", None)
    target = getattr(hyp, "fuzz_one_input", None)
    if target is None:
        name = getattr(test, "__qualname__", test)
        raise InvalidArgument(f"{name!r} is neither a @given nor a @flashcheck.fuzz test")
    return target  # type: ignore[no-any-return]


def run_atheris(
    test: Callable[..., Any], *, argv: Sequence[str] = (), instrument: Sequence[Any] | str = (), runs: int | None = None
) -> None:
    """Fuzz `test` with atheris (libFuzzer) until `runs` inputs or a crash; this process exits afterwards.

    Args:
        test: a ``@given`` or ``@flashcheck.fuzz`` test.
        argv: libFuzzer arguments (``-runs=N``, ``-max_total_time=S``, corpus directories...).
        instrument: functions to instrument for coverage (``atheris.instrument_func``), or ``"all"`` for every
            loaded Python function (slow to set up on large libraries such as torch).
        runs: shorthand for ``-runs=N``.
    """
    atheris = load_atheris()
    if instrument == "all":
        atheris.instrument_all()
    elif isinstance(instrument, str):
        raise InvalidArgument(f"instrument must be 'all' or a list of functions, got {instrument!r}")
    else:
        for fn in instrument:
            atheris.instrument_func(fn)
    target = fuzz_one_input(test)
    args = [sys.argv[0], *argv] + ([f"-runs={runs}"] if runs is not None else [])
    atheris.Setup(args, target)
    atheris.Fuzz()
