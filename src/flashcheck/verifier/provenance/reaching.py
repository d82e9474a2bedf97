"""Which assignments of a local name can reach a read of it: those before the read in the function's text, and
those later in a loop that holds the read too (the next iteration reads them).

Without this a name that holds a host flag first and a device tensor later (``ok = idx is not None`` read in
``if ok:``, then ``ok = torch.gather(...)``) reads as a device tensor everywhere. Branches are not told apart: an
assignment in an ``if`` before the read reaches it whether or not the branch ran.
"""

from __future__ import annotations

import ast

from flashcheck.verifier.index import FunctionInfo

__all__ = ["Reaching"]

_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


class Reaching:
    """Loop spans per function, computed on first use."""

    def __init__(self) -> None:
        self._loops: dict[int, list[tuple[int, int]]] = {}

    def keep(self, values: list[ast.expr], read: ast.expr, fn: FunctionInfo) -> list[ast.expr]:
        """The assignment values of `fn` (right-hand sides, in `fn`) that can reach `read`; all of them when none
        can (a read the text does not order, such as a name first bound in a branch below a loop)."""
        if len(values) < 2 or not hasattr(read, "lineno"):
            return values
        kept = [v for v in values if self._reaches(v, read, fn)]
        return kept or values

    def _reaches(self, value: ast.expr, read: ast.expr, fn: FunctionInfo) -> bool:
        at, col = read.lineno, read.col_offset
        end = (getattr(value, "end_lineno", None) or value.lineno, getattr(value, "end_col_offset", None) or 0)
        if end < (at, col):
            return True  # assigned before the read
        return any(first <= at <= last and first <= value.lineno <= last for first, last in self._spans(fn))

    def _spans(self, fn: FunctionInfo) -> list[tuple[int, int]]:
        found = self._loops.get(id(fn))
        if found is None:
            found = self._loops[id(fn)] = []
            body = fn.node.body if isinstance(fn.node, ast.Module) else [*fn.node.body]
            todo: list[ast.AST] = list(body)
            while todo:
                node = todo.pop()
                if isinstance(node, _SCOPES):
                    continue  # a nested function's loops are its own
                if isinstance(node, _LOOPS):
                    found.append((node.lineno, getattr(node, "end_lineno", None) or node.lineno))
                todo.extend(ast.iter_child_nodes(node))
        return found
