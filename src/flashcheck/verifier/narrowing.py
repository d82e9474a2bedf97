"""The class an ``isinstance`` test narrows a name to where it is read: inside ``if isinstance(meta, DecodeMeta):``,
in the ``else`` of ``if not isinstance(meta, DecodeMeta):``, after ``assert isinstance(meta, DecodeMeta)`` and after
``if not isinstance(meta, DecodeMeta): return`` (or ``raise``, ``continue``) in the same block; the test may be one
operand of an ``and`` (inside) or of an ``or`` of negated tests (after an exit). A parameter declared with a union
(``meta: AttnMetadata`` with ``AttnMetadata = Union[DecodeMeta, ExtendMeta]``) is then of that class there. Part of
`flashcheck.verifier.instances.InstanceTyping`."""

from __future__ import annotations

import ast
import weakref
from collections.abc import Sequence

from flashcheck.verifier.astutil import dotted, statement_blocks
from flashcheck.verifier.index import FunctionInfo
from flashcheck.verifier.syntax_reads import function_text

__all__ = ["isinstance_narrowed"]


def isinstance_narrowed(name: ast.Name, fn: FunctionInfo) -> ast.expr | None:
    """The class expression an ``isinstance`` test of `name`'s variable narrows it to at `name`'s line, or None."""
    if isinstance(fn.node, ast.Module) or name.id not in _tested_names(fn):
        return None  # most reads: no isinstance test of this name in the function
    return _in_block(fn.node.body, name.id, getattr(name, "lineno", 0))


_TESTED: weakref.WeakKeyDictionary[FunctionInfo, frozenset[str]] = weakref.WeakKeyDictionary()


def _tested_names(fn: FunctionInfo) -> frozenset[str]:
    """The names a branch or assert of `fn` tests with ``isinstance`` (once per function)."""
    found = _TESTED.get(fn)
    if found is None and "isinstance" not in function_text(fn):
        found = _TESTED[fn] = frozenset()  # no test to walk for (most functions)
    if found is None:
        tests = [*fn.tests, *(a.test for a in fn.asserts)]
        calls = (n for t in tests for n in ast.walk(t) if isinstance(n, ast.Call) and dotted(n.func) == "isinstance")
        found = _TESTED[fn] = frozenset(c.args[0].id for c in calls if c.args and isinstance(c.args[0], ast.Name))
    return found


def _isinstance_of(test: ast.expr, var: str) -> ast.expr | None:
    """X of ``isinstance(var, X)`` (one class, not a tuple), also as an operand of ``and`` (true only where every
    operand is), else None."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return next((x for v in test.values if (x := _isinstance_of(v, var)) is not None), None)
    if (
        isinstance(test, ast.Call)
        and dotted(test.func) == "isinstance"
        and len(test.args) == 2
        and isinstance(test.args[0], ast.Name)
        and test.args[0].id == var
        and isinstance(test.args[1], ast.Name | ast.Attribute)
    ):
        return test.args[1]
    return None


def _negated(test: ast.expr, var: str) -> ast.expr | None:
    """X where `test` is false only if `var` is an X: ``not isinstance(var, X)``, also as an operand of ``or``
    (``if not isinstance(mod, Attention) or mod.window is None: continue``)."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        return next((x for v in test.values if (x := _negated(v, var)) is not None), None)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _isinstance_of(test.operand, var)
    return None


def _end(node: ast.stmt) -> int:
    return node.end_lineno or node.lineno


def _within(body: Sequence[ast.stmt], line: int) -> bool:
    return bool(body) and body[0].lineno <= line <= _end(body[-1])


def _exits(body: Sequence[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[-1], ast.Return | ast.Raise | ast.Continue | ast.Break)


def _in_block(body: Sequence[ast.stmt], var: str, line: int) -> ast.expr | None:
    """The narrowing at `line` within the statements `body` (the innermost test that holds there wins)."""
    found: ast.expr | None = None
    for st in body:
        if st.lineno > line:
            break
        if isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        if _rebinds(st, var) and _end(st) < line:
            found = None  # meta = other_meta(): what the test said no longer holds
        if isinstance(st, ast.Assert) and _end(st) < line:
            found = _isinstance_of(st.test, var) or found
        if isinstance(st, ast.If):
            kept, dropped = _isinstance_of(st.test, var), _negated(st.test, var)
            if _within(st.body, line):
                return _in_block(st.body, var, line) or kept
            if _within(st.orelse, line):
                return _in_block(st.orelse, var, line) or dropped
            if dropped is not None and _exits(st.body) and _end(st) < line:
                found = dropped  # if not isinstance(meta, X): return  ... meta is an X below
            continue
        for inner in statement_blocks(st):
            if _within(inner, line):
                return _in_block(inner, var, line) or found
    return found


def _rebinds(st: ast.stmt, var: str) -> bool:
    targets = st.targets if isinstance(st, ast.Assign) else [st.target] if isinstance(st, ast.AnnAssign) else []
    return any(isinstance(t, ast.Name) and t.id == var for t in targets)
