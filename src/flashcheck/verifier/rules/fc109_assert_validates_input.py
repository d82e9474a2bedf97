"""FC109 assert-validates-input: ``assert`` used to validate a public function's arguments in library code."""

from __future__ import annotations

import ast

from flashcheck.findings import Confidence, Severity
from flashcheck.verifier.engine import Context, Rule, rule
from flashcheck.verifier.rules.fc101_host_sync import snippet


@rule("FC109", "assert-validates-input", severity=Severity.WARNING, confidence=Confidence.MEDIUM)
class AssertValidatesInput(Rule):
    """``assert`` validates the arguments of a public function in library code.

    What it checks
        ``assert`` statements in public functions and methods (names not starting with ``_``; dunders such as
        ``__init__`` count as public) outside test files, whose condition reads one of the function's parameters
        (other than ``self``/``cls``). Asserts on the object's own state, in private helpers and in tests are
        internal invariants and are not reported.

    Why it breaks serving
        ``python -O`` strips asserts, and engines are run that way in production images: the check that stopped a
        bad ``kv_indptr`` or a too-large batch in CI is gone where it matters, and the kernel reads out of bounds
        instead. When not stripped, an ``AssertionError`` carries no numbers, and FlashInfer-facing code cannot tell
        a rejected input from a bug.

    Example
        ::

            def init_forward_metadata(self, batch_size, kv_indptr):
                assert batch_size <= self.max_bs                  # FC109

    Use instead
        ``if batch_size > self.max_bs: raise ValueError(f"batch_size={batch_size} > max_bs={self.max_bs}; ...")``:
        an exception that survives ``-O`` and says what happened and what to do.

    Known false positives
        Asserts used only to narrow a type for the type checker (``assert x is not None`` on an argument) are
        reported; narrow with ``if x is None: raise ...`` or ``typing.cast``.
    """

    def check(self, ctx: Context) -> None:
        for fn in ctx.project.functions:
            if not fn.asserts or fn.source.is_test:
                continue
            if fn.name.startswith("_") and not (fn.name.startswith("__") and fn.name.endswith("__")):
                continue
            params = set(fn.params) - {"self", "cls"}
            for a in fn.asserts:
                if isinstance(a.test, ast.Constant):
                    continue  # assert False, "unreachable"
                used = sorted({n.id for n in ast.walk(a.test) if isinstance(n, ast.Name)} & params)
                if used:
                    ctx.report(
                        self,
                        fn,
                        a,
                        f"`{snippet(a, 60)}` validates argument(s) {', '.join(used)} of {fn.short} with assert, "
                        "which python -O removes",
                        hint="raise ValueError/TypeError with the offending values and the accepted range instead",
                        evidence={"parameters": used},
                    )
