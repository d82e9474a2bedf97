"""FC199 file-does-not-parse: a file could not be read or parsed, so no other rule checked it."""

from __future__ import annotations

from flashcheck.verifier.engine import Context, Rule, rule


@rule("FC199", "file-does-not-parse")
class FileDoesNotParse(Rule):
    """A Python file could not be decoded as UTF-8 or parsed; it was skipped and the run went on.

    What it checks
        Every file given to ``flashcheck static`` is parsed once with the running Python's grammar. A syntax error,
        a null byte or an undecodable file becomes one finding at the reported line; the other files are checked as
        usual.

    Why it breaks serving
        An unchecked file is a blind spot: a hot-path function defined in it is neither a root nor reachable, so its
        host syncs and buffer writes go unreported while the run looks clean.

    Example
        ::

            def plan(self, batch:    # FC199: '(' was never closed

    Use instead
        Fix the file, run flashcheck with the Python version the engine targets, or exclude generated files with
        ``exclude = ["gen/*"]`` in ``[tool.flashcheck.static]``.

    Known false positives
        Files written for a newer Python than the one running flashcheck (``match`` statements on 3.9, PEP 695
        generics before 3.12) are reported; run flashcheck under the engine's Python.
    """

    def check(self, ctx: Context) -> None:
        """Reported by the engine while it reads files."""
