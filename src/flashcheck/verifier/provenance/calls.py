"""One pass over a project's calls for the value flow: constructor-like calls and their keywords, ``functools.partial``
/ ``types.MethodType`` bindings, and ``dataclasses.replace`` copies.
"""

from __future__ import annotations

import ast

from flashcheck.verifier.astutil import dotted
from flashcheck.verifier.copies import copied
from flashcheck.verifier.index import owner_of as owner
from flashcheck.verifier.project import PARTIALS, ClassInfo, FunctionInfo, Project

__all__ = ["NAMESPACES", "CallScan", "is_partial", "keyword_fields", "namespace_owner"]

_COPIES = frozenset({"replace", "_replace", "evolve"})  # copies by their usual names (others: imported aliases)

_PARTIAL_TARGETS = frozenset({"functools.partial", "types.MethodType"})


def is_partial(func: ast.expr, fn: FunctionInfo) -> bool:
    """``functools.partial`` / ``types.MethodType``, also imported under another name (``from functools import
    partial as bind``)."""
    d = dotted(func)
    if d is None:
        return False
    if d in PARTIALS:
        return True
    head, _, rest = d.partition(".")
    target = fn.module.imports.get(head)
    return target is not None and (f"{target}.{rest}" if rest else target) in _PARTIAL_TARGETS


class CallScan:
    """The project's calls by what the value flow asks of them (each index built once, on first use)."""

    def __init__(self, project: Project) -> None:
        self.project = project
        self._kw_index: dict[str, list[tuple[ast.expr, FunctionInfo, ast.Call]]] | None = None
        self._class_calls: dict[str, list[tuple[FunctionInfo, ast.Call]]] | None = None
        self._partials: list[tuple[FunctionInfo, ast.Call]] | None = None
        self._replaces: list[tuple[FunctionInfo, ast.Call]] | None = None
        self._bindings: dict[int, list[tuple[FunctionInfo, ast.Call]]] | None = None
        self._foreign_items: dict[str, list[tuple[ast.expr, ast.expr, FunctionInfo]]] | None = None
        self._records: frozenset[str] | None = None
        self._makes_records: bool | None = None

    def record_factories(self) -> frozenset[str]:
        """`_record_factories` of the project, found once."""
        if self._records is None:
            self._records = _record_factories(self.project)
        return self._records

    def makes_records(self) -> bool:
        """Whether the project makes loose records: a record factory, or a ``SimpleNamespace`` call."""
        if self._makes_records is None:
            made = "SimpleNamespace" in self.class_calls() or "Namespace" in self.class_calls()
            self._makes_records = bool(self.record_factories()) or made
        return self._makes_records

    def foreign_item_stores(self, attr: str) -> list[tuple[ast.expr, ast.expr, FunctionInfo]]:
        """``obj.attr[k] = value`` outside ``obj``'s own methods (``self.backend.graph_wrappers[bs] = w``), by
        attribute name: (receiver, value, function)."""
        if self._foreign_items is None:
            self._foreign_items = {}
            for f in self.project.all_functions():
                for a in f.assigns:
                    if not isinstance(a, ast.Assign):
                        continue
                    for t in a.targets:
                        base = t.value if isinstance(t, ast.Subscript) else None
                        if isinstance(base, ast.Attribute) and not (
                            isinstance(base.value, ast.Name) and base.value.id == "self"
                        ):
                            self._foreign_items.setdefault(base.attr, []).append((base.value, a.value, f))
        return self._foreign_items.get(attr, [])

    def replaces(self) -> list[tuple[FunctionInfo, ast.Call]]:
        """Copies with fields passed (`flashcheck.verifier.copies.copied`): ``dataclasses.replace(obj, field=value)``,
        attrs' ``evolve(obj, field=value)``, ``obj._replace(field=value)`` (a NamedTuple's)."""
        if self._replaces is None:
            self._scan_calls()
        assert self._replaces is not None
        return self._replaces

    def bindings(self) -> dict[int, list[tuple[FunctionInfo, ast.Call]]]:
        """``functools.partial(f, ...)`` and ``types.MethodType(f, ...)`` calls, by the project function bound."""
        if self._bindings is None:
            if self._partials is None:
                self._scan_calls()
            self._bindings = {}
            for f, call in self._partials or []:
                target = call.args[0]
                bound = self.project.resolve_def(target, f) if isinstance(target, ast.Name | ast.Attribute) else None
                if isinstance(bound, FunctionInfo):
                    self._bindings.setdefault(id(bound), []).append((f, call))
        return self._bindings

    def keyword_index(self) -> dict[str, list[tuple[ast.expr, FunctionInfo, ast.Call]]]:
        """Keyword arguments of calls to class-like names (``ForwardBatch(seq_lens=...)``), by ``Class.keyword``
        and by ``*.keyword``."""
        if self._kw_index is None:
            self._scan_calls()
        assert self._kw_index is not None
        return self._kw_index

    def class_calls(self) -> dict[str, list[tuple[FunctionInfo, ast.Call]]]:
        """Calls of class-like names (capitalised, or ``cls``), by that name."""
        if self._class_calls is None:
            self._scan_calls()
        assert self._class_calls is not None
        return self._class_calls

    def _scan_calls(self) -> None:
        """One pass over the project's calls: constructor-like calls, their keywords, and partial bindings."""
        kw_index: dict[str, list[tuple[ast.expr, FunctionInfo, ast.Call]]] = {}
        class_calls: dict[str, list[tuple[FunctionInfo, ast.Call]]] = {}
        partials: list[tuple[FunctionInfo, ast.Call]] = []
        replaces: list[tuple[FunctionInfo, ast.Call]] = []
        records = self.record_factories()
        for f in self.project.all_functions():
            for call in f.calls:
                callee = call.func
                last = callee.attr if isinstance(callee, ast.Attribute) else getattr(callee, "id", "")
                maybe = last in ("partial", "MethodType") or (isinstance(callee, ast.Name) and last in f.module.imports)
                if maybe and call.args and is_partial(callee, f):
                    partials.append((f, call))
                elif call.keywords and (last in _COPIES or last in f.module.imports) and copied(call, f) is not None:
                    replaces.append((f, call))  # dataclasses.replace, attrs' evolve, a NamedTuple's _replace
                elif last[:1].isupper() or last == "cls" or last in records:
                    class_calls.setdefault(last, []).append((f, call))
                    for key, value in keyword_fields(call, f):
                        kw_index.setdefault(f"{last}.{key}", []).append((value, f, call))
                        kw_index.setdefault(f"*.{key}", []).append((value, f, call))
        self._kw_index, self._class_calls, self._partials, self._replaces = kw_index, class_calls, partials, replaces

    def constructs(self, call: ast.Call, fn: FunctionInfo, cls: ClassInfo) -> bool:
        f = call.func
        if isinstance(f, ast.Name) and f.id == "cls":
            return owner(fn).cls is cls
        target = self.project.resolve_def(f, fn) if isinstance(f, ast.Name | ast.Attribute) else None
        return target is cls


def keyword_fields(call: ast.Call, fn: FunctionInfo) -> list[tuple[str, ast.expr]]:
    """The fields a call passes by keyword: its keywords, and the items of a dict literal it spreads, written in
    place or bound once to a local (``make_record(mode=m, **dev)`` after ``dev = {"seq_lens": s, ...}``)."""
    out: list[tuple[str, ast.expr]] = []
    for kw in call.keywords:
        if kw.arg:
            out.append((kw.arg, kw.value))
            continue
        spread = kw.value
        if isinstance(spread, ast.Name) and len(bound := fn.local_assigns.get(spread.id, [])) == 1:
            spread = bound[0]
        if isinstance(spread, ast.Dict):
            out += [
                (k.value, v)
                for k, v in zip(spread.keys, spread.values, strict=True)
                if isinstance(k, ast.Constant) and isinstance(k.value, str)
            ]
    return out


NAMESPACES = frozenset({"SimpleNamespace", "types.SimpleNamespace", "argparse.Namespace", "Namespace"})


def _record_factories(project: Project) -> frozenset[str]:
    """Names of project functions that make a record of the fields their callers pass by keyword: a ``**fields``
    parameter spread into a namespace (``SimpleNamespace(**fields)``) or into an object's ``__dict__``
    (``ns.__dict__.update(updates)``, ``vars(ns).update(updates)``). Their callers' keywords are fields of the
    record, as a class's constructor keywords are (a class's own constructor is typed as that class instead)."""
    out: set[str] = set()
    for f in project.all_functions():
        node = f.node
        kwarg = node.args.kwarg if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) else None
        if kwarg is None:
            continue
        for call in f.calls:
            func = call.func
            last = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            spread = any(
                k.arg is None and isinstance(k.value, ast.Name) and k.value.id == kwarg.arg for k in call.keywords
            )
            updated = (
                last == "update"
                and isinstance(func, ast.Attribute)
                and namespace_owner(func.value) is not None
                and any(isinstance(a, ast.Name) and a.id == kwarg.arg for a in call.args)
            )
            if (spread and (dotted(func) or "") in NAMESPACES) or updated:
                out.add(f.name)
                break
    return frozenset(out)


def namespace_owner(expr: ast.expr) -> ast.expr | None:
    """``obj`` of ``obj.__dict__`` or ``vars(obj)``, else None."""
    if isinstance(expr, ast.Attribute):
        return expr.value if expr.attr == "__dict__" else None
    named = isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "vars"
    return expr.args[0] if named and isinstance(expr, ast.Call) and len(expr.args) == 1 else None
