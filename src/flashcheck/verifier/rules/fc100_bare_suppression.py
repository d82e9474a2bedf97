"""FC100 bare-suppression: a ``# flashcheck: ignore`` comment without rule IDs or without a reason."""

from __future__ import annotations

from flashcheck.findings import Severity
from flashcheck.verifier.engine import Context, Rule, rule


@rule("FC100", "bare-suppression", severity=Severity.WARNING)
class BareSuppression(Rule):
    """A suppression comment names no rule, an unknown rule, or gives no reason.

    What it checks
        Every ``# flashcheck: ignore[...]`` comment in the checked files must name one or more rule IDs (or ID
        prefixes) that exist and be followed by a reason: ``# flashcheck: ignore[FC101] runs once at start-up``.
        The comment covers its own line, or the next code line when it stands alone. The engine reports this rule
        itself while applying suppressions.

    Why it breaks serving
        A suppression without a reason cannot be reviewed: nobody can tell later whether the sync or private access
        it hides is still harmless after the code around it changed, and blanket suppressions hide new bugs on the
        same line.

    Example
        ::

            total = qo_indptr[-1].item()  # flashcheck: ignore[FC101]          <- FC100: no reason

    Use instead
        ::

            total = qo_indptr[-1].item()  # flashcheck: ignore[FC101] debug-only path, guarded by FLASHCHECK_DEBUG

    Known false positives
        The text ``# flashcheck: ignore`` inside a string literal is read as a comment.
    """

    def check(self, ctx: Context) -> None:
        """Reported by the engine while it applies suppressions."""
