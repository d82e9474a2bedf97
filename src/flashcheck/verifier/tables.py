"""Calls picked from a table by a key the walk knows: ``handler = self._forward_table[(fb.forward_mode,
fb.use_graph)]; handler(q, fb)`` runs only the handlers stored under keys that can equal the lookup's, where the
path binds a part of it (`flashcheck.verifier.guards`: the capture root's ``ForwardBatch(..., use_graph=True)``
hands ``use_graph`` down, so the eager handlers under ``(mode, False)`` keys do not run under the capture). Keys are
read from dict literals (a module global, a class attribute, ``self.x = {...}``); a table also filled by item stores
with keys the walk cannot compare, or a callee the literal does not hold, is not narrowed. Part of
`flashcheck.verifier.hotpath`'s walk.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import TYPE_CHECKING

from flashcheck.verifier.guards import UNKNOWN, Member, bound_value, member
from flashcheck.verifier.index import FunctionInfo, descendants, owner_of, with_bases

if TYPE_CHECKING:
    from flashcheck.verifier.project import Project

__all__ = ["ruled_out_by_key"]


def ruled_out_by_key(
    project: Project, fn: FunctionInfo, call: ast.Call, callee: FunctionInfo, env: Mapping[str, object]
) -> bool:
    """Whether `call` in `fn` runs `callee` only as an item of a table whose every key holding it differs from the
    lookup's key in a part that `env` decides."""
    if not env:
        return False
    lookup = _lookup(call.func, fn)
    if lookup is None:
        return False
    table, key = lookup
    if table.attr in _changed(project):
        return False  # self.table |= {...}, self.table.update(more): keys the walk does not read
    wanted = [bound_value(e, env) for e in key.elts] if isinstance(key, ast.Tuple) else [bound_value(key, env)]
    if all(w is UNKNOWN for w in wanted):
        return False
    entries = _entries(table, fn)
    if entries is None:
        return False  # bound to something other than a dict literal somewhere: its keys are not read
    holding = [k for k, v, where in entries if callee in project.callables(v, where, partials=True)]
    return bool(holding) and all(not _may_equal(k, wanted) for k in holding)


def _lookup(func: ast.expr, fn: FunctionInfo) -> tuple[ast.Attribute, ast.expr] | None:
    """(the table, the key) of ``self.table[key](...)`` or of a local bound once to ``self.table[key]``."""
    if isinstance(func, ast.Name):
        values = fn.local_assigns.get(func.id, [])
        func = values[0] if len(values) == 1 else func
    if (
        isinstance(func, ast.Subscript)
        and isinstance(func.value, ast.Attribute)
        and not isinstance(func.slice, ast.Slice)
    ):
        return func.value, func.slice
    return None


def _entries(table: ast.Attribute, fn: FunctionInfo) -> list[tuple[ast.expr | None, ast.expr, FunctionInfo]] | None:
    """(key, value, where) of the dict literals an attribute of ``self`` is bound to (in the class, its bases and
    its subclasses); a key None for an item stored under a key that is not a literal; None where the attribute is
    also bound to anything but a dict literal."""
    if not (isinstance(table.value, ast.Name) and table.value.id == "self"):
        return None
    cls = owner_of(fn).cls
    out: list[tuple[ast.expr | None, ast.expr, FunctionInfo]] = []
    family = [*with_bases(cls), *descendants(cls)] if cls is not None else []  # a subclass may bind it again
    for c in family:
        for value, where in c.attr_assigns.get(table.attr, []):
            if not isinstance(value, ast.Dict):
                return None
            out += [(k, v, where) for k, v in zip(value.keys, value.values, strict=True)]
        for value, where in c.item_assigns.get(table.attr, []):
            out.append((None, value, where))  # self.table[(mode, flag)] = handler: a key the walk does not read
    return out


def _may_equal(key: ast.expr | None, wanted: list[object]) -> bool:
    """Whether a literal key can equal the lookup's (every part the path decides matches a constant part)."""
    if key is None:
        return True
    parts = key.elts if isinstance(key, ast.Tuple) else [key]
    if len(parts) != len(wanted):
        return True
    for part, w in zip(parts, wanted, strict=True):
        if isinstance(w, Member):  # {Mode.DECODE: self._decode}[fb.mode]: another member is another entry
            if (m := member(part)) is not None and m.enum == w.enum and m != w:
                return False
        elif w is not UNKNOWN and isinstance(part, ast.Constant) and part.value != w:
            return False
    return True


def _changed(project: Project) -> frozenset[str]:
    """Attribute names of dicts some code updates in place other than by an item store: ``x.table |= {...}``,
    ``x.table.update(...)``, ``x.table.setdefault(...)`` (built once per project)."""
    found = project.changed_tables
    if found is None:
        functions = list(project.all_functions())
        augmented = {
            a.target.attr
            for f in functions
            for a in f.assigns
            if isinstance(a, ast.AugAssign) and isinstance(a.target, ast.Attribute)
        }
        updated = {
            c.func.value.attr
            for f in functions
            for c in f.calls
            if isinstance(c.func, ast.Attribute)
            and c.func.attr in ("update", "setdefault")
            and isinstance(c.func.value, ast.Attribute)
        }
        names = augmented | updated
        found = project.changed_tables = frozenset(names)
    return found
