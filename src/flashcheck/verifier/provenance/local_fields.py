"""A field a function stores on a local object before it reads it: ``snap = copy.copy(meta); snap.kv_indptr =
meta.kv_indptr_cpu[: n + 1]; w.plan(snap.kv_indptr, ...)`` reads the host mirror, whatever the class declares for
``kv_indptr``; so does ``snap.kv_indptr`` after ``snap = host_view(meta)`` where the helper stores it on the object
it returns (or returns ``dataclasses.replace(meta, kv_indptr=...)``). Only a store that runs before every such
read (in the read's block or one that holds it, earlier) and the only store of that field on that name in the
function counts. Part of `flashcheck.verifier.provenance.flow`."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import TYPE_CHECKING

from flashcheck.verifier.astutil import statement_blocks
from flashcheck.verifier.copies import copied
from flashcheck.verifier.index import FunctionInfo

if TYPE_CHECKING:
    from flashcheck.verifier.project import Project

__all__ = ["local_field_sources"]


def local_field_sources(expr: ast.Attribute, fn: FunctionInfo, project: Project) -> list[tuple[ast.expr, FunctionInfo]]:
    """The value `fn` (or the helper that returned the object) stored in ``name.attr`` before `expr` reads it; []
    where no such store decides it."""
    base = expr.value
    if isinstance(base, ast.Name):
        if base.id in ("self", "cls") or len(fn.local_assigns.get(base.id, [])) > 1:
            return []
        stored = _dominating(fn, base.id, expr.attr, expr.lineno)
        if stored is not None:
            return [(stored, fn)]
        bound = fn.local_assigns.get(base.id, [])
        made = bound[0] if base.id not in fn.params and len(bound) == 1 else None
    else:
        made = base  # host_view(meta).seq_lens
    if not isinstance(made, ast.Call) or not isinstance(made.func, ast.Name | ast.Attribute):
        return []
    helper = project.resolve_def(made.func, fn)
    if not isinstance(helper, FunctionInfo) or not helper.returns:
        return []
    out: list[tuple[ast.expr, FunctionInfo]] = []
    for r in helper.returns:  # def host_view(meta): snap = copy.copy(meta); snap.x = ...; return snap
        if isinstance(r, ast.Name):
            value = _dominating(helper, r.id, expr.attr, r.lineno)
        else:
            value = _replaced(r, expr.attr, helper)  # return dataclasses.replace(meta, seq_lens=...)
        if value is None or (isinstance(r, ast.Name) and len(helper.local_assigns.get(r.id, [])) > 1):
            return []
        out.append((value, helper))
    return out


def _dominating(fn: FunctionInfo, name: str, attr: str, line: int) -> ast.expr | None:
    """The value of the one store ``name.attr = v`` of `fn` when it runs before `line` on every path."""
    stores = [a for a in fn.assigns if any(_is_field(t, name, attr) for t in _targets(a))]
    if len(stores) != 1 or not isinstance(stores[0], ast.Assign | ast.AnnAssign) or stores[0].value is None:
        return None
    store = stores[0]
    body: Sequence[ast.stmt] = fn.node.body if not isinstance(fn.node, ast.Module) else []
    while body:
        holder = next((st for st in body if st.lineno <= line <= (st.end_lineno or st.lineno)), None)
        if any(st is store for st in body) and store.lineno < line and holder is not store:
            return store.value
        if holder is None or isinstance(holder, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return None
        body = next((b for b in statement_blocks(holder) if b and b[0].lineno <= line <= (b[-1].end_lineno or 0)), [])
    return None


def _replaced(value: ast.expr, attr: str, fn: FunctionInfo) -> ast.expr | None:
    """`attr`'s value in a copy that passes it (``dataclasses.replace(obj, attr=v)``, ``evolve``, ``_replace``)."""
    if copied(value, fn) is None:
        return None
    assert isinstance(value, ast.Call)
    return next((k.value for k in value.keywords if k.arg == attr), None)


def _targets(a: ast.stmt) -> list[ast.expr]:
    if isinstance(a, ast.Assign):
        return a.targets
    return [a.target] if isinstance(a, ast.AnnAssign | ast.AugAssign) else []


def _is_field(t: ast.expr, name: str, attr: str) -> bool:
    return isinstance(t, ast.Attribute) and t.attr == attr and isinstance(t.value, ast.Name) and t.value.id == name
