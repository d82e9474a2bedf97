"""One seed, one fuzz run: what Hypothesis draws must not depend on what this process imported before the run.

Hypothesis (6.131 and later) sometimes draws a constant it found in the source of the *local* modules (not installed
in site-packages, not tests) that are in ``sys.modules`` when it draws. Which modules those are depends on the
process's history: the tests that ran before, an earlier in-process pytest run, the CLI subcommand, the user's own
modules. So one seed drew other examples in a process that had imported one more module, and ``--flashcheck-seed``
did not repeat a run. A fuzz run draws from Hypothesis's fixed built-in constants only; flashcheck's strategies name
their own edge cases (`flashcheck.fuzzing.strategies.EDGE_CASES`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["no_source_constants"]


@contextlib.contextmanager
def no_source_constants() -> Iterator[None]:
    """Inside: Hypothesis draws no constant taken from the source of the modules this process imported. A Hypothesis
    without source constants (before 6.131) draws none anyway; nothing is changed then."""
    try:
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.constants_ast import Constants

        collect: Callable[..., Any] = providers._get_local_constants
        cache: Any = providers.CONSTANTS_CACHE  # (choice type, constraints) -> (built-in, source) constants allowed
        none = Constants()
    except (ImportError, AttributeError, TypeError):
        yield
        return
    providers._get_local_constants = lambda *args, **kwargs: none
    cache.cache.clear()
    try:
        yield
    finally:
        providers._get_local_constants = collect
        cache.cache.clear()  # what was allowed without source constants; computed again from them
