"""Which assignments of a local name can reach a read of it: those before the read in the function's text, and
those later in a loop that holds the read too (the next iteration reads them).

Without this a name that holds a host flag first and a device tensor later (``ok = idx is not None`` read in
``if ok:``, then ``ok = torch.gather(...)``) reads as a device tensor everywhere. Branches are not told apart: an
assignment in an ``if`` before the read reaches it whether or not the branch ran; but where an ``isinstance`` test
says a name holds no tensor (the ``else`` of ``if isinstance(x, torch.Tensor):``) a read of it is host data.
"""

from __future__ import annotations

import ast

from flashcheck.verifier.index import FunctionInfo

__all__ = ["Reaching"]

_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


class Reaching:
    """Loop spans and ``isinstance`` branches per function, computed on first use."""

    def __init__(self) -> None:
        self._loops: dict[int, list[tuple[int, int]]] = {}
        self._narrowed: dict[int, list[tuple[str, int, int]]] = {}
        self._kept: dict[ast.expr, list[ast.expr]] = {}

    def not_a_tensor(self, read: ast.Name, fn: FunctionInfo) -> bool:
        """Whether `read` sits where an ``isinstance`` test said the name holds no tensor: the ``else`` of ``if
        isinstance(x, torch.Tensor):``, the body of ``if not isinstance(x, torch.Tensor):``."""
        found = self._narrowed.get(id(fn))
        if found is None:
            self._spans(fn)
            found = self._narrowed[id(fn)]
        at = read.lineno
        return any(name == read.id and first <= at <= last for name, first, last in found)

    def keep(self, values: list[ast.expr], read: ast.expr, fn: FunctionInfo) -> list[ast.expr]:
        """The assignment values of `fn` (right-hand sides, in `fn`) that can reach `read`; all of them when none
        can (a read the text does not order, such as a name first bound in a branch below a loop)."""
        if len(values) < 2 or not hasattr(read, "lineno"):
            return values
        kept = self._kept.get(read)  # one answer per read: typing and the value flow both ask
        if kept is None:
            kept = self._kept[read] = [v for v in values if self.reaches(v, read, fn)] or values
        return kept

    def reaches(self, value: ast.expr, read: ast.expr, fn: FunctionInfo) -> bool:
        """Whether the assignment of `value` (a right-hand side in `fn`) can reach `read`."""
        at, col = read.lineno, read.col_offset
        end = (getattr(value, "end_lineno", None) or value.lineno, getattr(value, "end_col_offset", None) or 0)
        if end < (at, col):
            return True  # assigned before the read
        return any(first <= at <= last and first <= value.lineno <= last for first, last in self._spans(fn))

    def _spans(self, fn: FunctionInfo) -> list[tuple[int, int]]:
        found = self._loops.get(id(fn))
        if found is None:
            found = self._loops[id(fn)] = []
            narrowed = self._narrowed[id(fn)] = []
            todo: list[ast.AST] = list(fn.node.body)
            while todo:
                node = todo.pop()
                if isinstance(node, _SCOPES):
                    continue  # a nested function's loops are its own
                if isinstance(node, _LOOPS):
                    found.append((node.lineno, _end(node)))
                if isinstance(node, ast.If):
                    name, negated = _tensor_test(node.test)
                    branch = node.body if negated else node.orelse
                    if name is not None and branch:
                        narrowed.append((name, branch[0].lineno, _end(branch[-1])))
                todo.extend(ast.iter_child_nodes(node))
        return found


def _end(node: ast.stmt) -> int:
    return getattr(node, "end_lineno", None) or node.lineno


def _tensor_test(test: ast.expr) -> tuple[str | None, bool]:
    """(x, negated) for ``isinstance(x, torch.Tensor)`` or ``not isinstance(x, torch.Tensor)``."""
    negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
    call = test.operand if isinstance(test, ast.UnaryOp) and negated else test
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "isinstance"):
        return None, False
    if len(call.args) != 2 or not isinstance(call.args[0], ast.Name):
        return None, False
    kinds = call.args[1].elts if isinstance(call.args[1], ast.Tuple) else [call.args[1]]
    if not any(isinstance(k, ast.Name | ast.Attribute) and "Tensor" in ast.unparse(k) for k in kinds):
        return None, False
    return call.args[0].id, negated
