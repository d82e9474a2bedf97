"""Fields of loose records: ``types.SimpleNamespace(seq_lens=s)`` and a record factory's call (``make_record(mode=m,
**dev)``, `flashcheck.verifier.provenance.calls.CallScan.record_factories`). A field of such a record is the value
passed under its name (also through ``make_meta(**vars(rec))``), and what the reading function stores there through
an updater (``update_record(rec, accepted=a)``, ``rec.__dict__.update(accepted=a)``), not every store of that
attribute name in the project. Part of `flashcheck.verifier.provenance.flow`."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from flashcheck.verifier.astutil import dotted
from flashcheck.verifier.index import FunctionInfo
from flashcheck.verifier.provenance.calls import NAMESPACES, keyword_fields, namespace_owner

if TYPE_CHECKING:
    from flashcheck.verifier.provenance.flow import ValueFlow

__all__ = ["record_field_sources"]

Source = tuple[ast.expr, FunctionInfo]


def record_field_sources(expr: ast.Attribute, fn: FunctionInfo, flow: ValueFlow) -> list[Source] | None:
    """What field ``rec.attr`` holds where every value ``rec`` may be (a few steps back through names and the
    functions that return it) is a record made here or by a record factory: the value passed under that name, and
    what `fn` stores there through an updater; None where some value is not such a record."""
    factories = flow.calls.record_factories()
    out: list[Source] = []
    stack: list[tuple[ast.expr, FunctionInfo, int]] = [(expr.value, fn, 0)]
    seen = 0
    while stack:
        v, where, depth = stack.pop()
        seen += 1
        if seen > 16 or depth > 4:
            return None
        if isinstance(v, ast.Call) and _is_record(v, factories):
            out += [(value, where) for key, value in keyword_fields(v, where) if key == expr.attr]
            for copied_from in _spread_namespaces(v):  # make_meta(**vars(rec)): rec's field of that name
                out += flow.attr_sources(_field(copied_from, expr.attr), where)
            continue
        if not isinstance(v, ast.Name | ast.Call | ast.Attribute):  # an attribute: self.host = SimpleNamespace(...)
            return None
        found = flow.sources(v, where)
        if not found:
            return None
        stack.extend((s, w, depth + 1) for s, w in found[:8])
    if isinstance(expr.value, ast.Name):
        out += _updates(expr.value.id, expr.attr, fn, factories)
    return out


def _is_record(call: ast.Call, factories: frozenset[str]) -> bool:
    name = dotted(call.func) or ""
    return name in NAMESPACES or name.rsplit(".", 1)[-1] in factories


def _updates(name: str, key: str, fn: FunctionInfo, factories: frozenset[str]) -> list[Source]:
    """What `fn` passes under `key` to an updater of the record `name`: ``update_record(rec, key=v)`` (a record
    factory given the record first), ``rec.__dict__.update(key=v)``, ``vars(rec).update(key=v)``."""
    out: list[Source] = []
    for call in fn.calls:
        f = call.func
        target = None
        if isinstance(f, ast.Attribute) and f.attr == "update":
            target = namespace_owner(f.value)
        elif (dotted(f) or "").rsplit(".", 1)[-1] in factories and call.args:
            target = call.args[0]
        if isinstance(target, ast.Name) and target.id == name:
            out += [(value, fn) for k, value in keyword_fields(call, fn) if k == key]
    return out


def _spread_namespaces(call: ast.Call) -> list[ast.expr]:
    """The objects whose attributes a call spreads as keywords: ``**vars(rec)``, ``**rec.__dict__``."""
    return [o for kw in call.keywords if kw.arg is None and (o := namespace_owner(kw.value)) is not None]


def _field(obj: ast.expr, attr: str) -> ast.Attribute:
    """``obj.attr``, made once per object and field and kept on `obj` (caches keyed by node stay right)."""
    made: dict[str, ast.Attribute] = obj.__dict__.setdefault("_flashcheck_fields", {})
    if attr not in made:
        made[attr] = ast.copy_location(ast.Attribute(obj, attr, ast.Load()), obj)
    return made[attr]
