"""Registries of classes: a class picked from a table (``cls = BACKENDS[name]``, ``BACKENDS.get(name)``, a lookup
called directly: ``BACKENDS[name](cfg)``) may be any class the table lists, so calling the pick builds any of them
and its arguments reach each one's ``__init__``; so may a registry that the classes fill themselves as they are
defined (`flashcheck.verifier.subclassing`). Part of `flashcheck.verifier.project.Project`'s call graph."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import TYPE_CHECKING

from flashcheck.verifier.astutil import dotted
from flashcheck.verifier.index import ClassInfo, FunctionInfo, lambda_function, owner_of, with_bases
from flashcheck.verifier.instances import InstanceTyping
from flashcheck.verifier.subclassing import self_registered

__all__ = ["Registries", "registry_call_key"]


class Registries(InstanceTyping):
    """The registry half of `flashcheck.verifier.project.Project`."""

    _dispatch_impls: dict[int, list[FunctionInfo]] | None = None

    if TYPE_CHECKING:

        def all_functions(self) -> Iterator[FunctionInfo]: ...

        def calls_by_name(self) -> dict[str, list[tuple[FunctionInfo, ast.Call]]]: ...

    def dispatch_impls(self, generic: FunctionInfo) -> list[FunctionInfo]:
        """The implementations registered on a ``functools.singledispatch`` function (``@build_metadata.register``,
        ``@build_metadata.register(DecodeBatch)``, also of a ``singledispatchmethod``): a call of it runs any."""
        if self._dispatch_impls is None:
            index: dict[int, list[FunctionInfo]] = {}
            for f in self.all_functions():
                for deco in f.decorators:
                    d = deco.func if isinstance(deco, ast.Call) else deco
                    if isinstance(d, ast.Attribute) and d.attr == "register":
                        scope = f.parent if f.parent is not None else f
                        base = self.resolve_def(d.value, scope)
                        if base is None and f.cls is not None:  # @build.register inside the class
                            base = f.cls.methods.get(dotted(d.value) or "")
                        if isinstance(base, FunctionInfo) and base is not f:
                            index.setdefault(id(base), []).append(f)
                for call in f.calls:  # build.register(DecodeBatch, lambda b, be: ...), or a function by name
                    g = call.func
                    if not (isinstance(g, ast.Attribute) and g.attr == "register" and len(call.args) == 2):
                        continue
                    base = self.resolve_def(g.value, f)
                    impl = call.args[1]
                    made = lambda_function(impl) or (self.resolve_def(impl, f) if _named(impl) else None)
                    if isinstance(base, FunctionInfo) and isinstance(made, FunctionInfo):
                        index.setdefault(id(base), []).append(made)
            self._dispatch_impls = index
        if not any((dotted(d) or "").rsplit(".", 1)[-1].startswith("singledispatch") for d in generic.decorators):
            return []
        return self._dispatch_impls.get(id(generic), [])

    def registry_classes(self, func: ast.expr, fn: FunctionInfo) -> list[ClassInfo]:
        """The classes a local picked from a registry may be (``cls = BACKENDS[name]``, ``BACKENDS.get(name)``;
        ``cls(cfg)`` builds any of them), or a lookup called directly (``BACKENDS[name](cfg)``), when the registry is a
        dict, list or tuple literal of project classes held in a module global (also one imported from another project
        module) or a class attribute."""
        if isinstance(func, ast.Name):
            lookups = fn.local_assigns.get(func.id, [])[:4]
        elif _registry_lookup(func):
            lookups = [func]  # BACKENDS[name](cfg): the lookup called directly
        else:
            return []
        found: dict[int, ClassInfo] = {}
        for v in lookups:
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr == "get":
                table = v.func.value
            elif isinstance(v, ast.Subscript) and not isinstance(v.slice, ast.Slice):
                table = v.value
            else:
                return []
            for lit, where in self._table_values(table, fn):
                items = lit.values if isinstance(lit, ast.Dict) else getattr(lit, "elts", [])
                for item in items[:16]:
                    t = self.resolve_def(item, where) if isinstance(item, ast.Name | ast.Attribute) else None
                    if isinstance(t, ClassInfo):
                        found[id(t)] = t
            if isinstance(table, ast.Attribute):  # Backend._registry[name] = cls in __init_subclass__, or a metaclass's
                for c in with_bases(self._table_owner(table, fn)):
                    found.update((id(t), t) for t in self_registered(c, table.attr, self.classes.values()))
        return list(found.values())

    def registry_base(self, func: ast.expr, fn: FunctionInfo) -> ClassInfo | None:
        """The project class that every class a registry lookup may pick derives from (itself, or their nearest
        common base): what calling the pick builds is known as one of it."""
        picked = self.registry_classes(func, fn) if _registry_lookup(func) else []
        if not picked:
            return None
        common = [c for c in with_bases(picked[0]) if all(c in with_bases(p) for p in picked[1:])]
        return common[0] if common else None

    def _table_owner(self, table: ast.Attribute, fn: FunctionInfo) -> ClassInfo | None:
        """The class whose attribute a registry is: of ``self``/an object, of ``cls`` in a classmethod, or the class
        named (``AttentionBackend._registry``, ``_WorkspaceMeta.kinds``)."""
        named = self.resolve_def(table.value, fn) if isinstance(table.value, ast.Name) else None
        if isinstance(named, ClassInfo):
            return named
        if isinstance(table.value, ast.Name) and table.value.id == "cls":
            return owner_of(fn).cls
        return self.instance_type(table.value, fn, 1)

    def registry_names(self) -> dict[str, set[str]]:
        """Class name -> the local names that may hold it, picked from a registry of classes (``cls =
        BACKENDS[name]``): calls of those names build it (`Project.callers` of its ``__init__``)."""
        found: dict[str, set[str]] | None = getattr(self, "_registry_index", None)
        if found is None:
            found = {}
            for fn in self.functions:
                for name, values in fn.local_assigns.items():
                    if any(_registry_lookup(v) for v in values):
                        for c in self.registry_classes(ast.Name(name), fn):
                            found.setdefault(c.name, set()).add(name)
                for call in fn.calls:  # BACKENDS[name](cfg): under the key `calls_by_name` files it by
                    key = registry_call_key(call.func)
                    for c in self.registry_classes(call.func, fn) if key else ():
                        found.setdefault(c.name, set()).add(key or "")
            self._registry_index = found
        return found

    def registry_held(self, func: ast.expr) -> bool:
        """Whether `func` is a local name some function binds from a registry of classes (the index, built once,
        answers before `registry_classes` looks at the function's own bindings)."""
        key = func.id if isinstance(func, ast.Name) else registry_call_key(func)
        return key is not None and any(key in names for names in self.registry_names().values())

    def _table_values(self, table: ast.expr, fn: FunctionInfo) -> list[tuple[ast.expr, FunctionInfo]]:
        """What a registry name or attribute is bound to (module globals, imported ones, class attributes)."""
        if isinstance(table, ast.Attribute):
            cls = self._table_owner(table, fn)
            return [vw for c in with_bases(cls) for vw in c.attr_assigns.get(table.attr, [])]
        if not isinstance(table, ast.Name):
            return []
        return self.global_values(fn.module, table.id)


def _named(node: ast.expr) -> bool:
    return isinstance(node, ast.Name | ast.Attribute)


def registry_call_key(func: ast.expr) -> str | None:
    """``BACKENDS[]`` for a call of a lookup in a table (``BACKENDS[name](cfg)``, ``self.table.get(name)(cfg)``):
    the name `Project.calls_by_name` files such calls by; None for other callees."""
    if not _registry_lookup(func):
        return None
    table = func.func.value if isinstance(func, ast.Call) and isinstance(func.func, ast.Attribute) else func
    table = table.value if isinstance(table, ast.Subscript) else table
    name = table.id if isinstance(table, ast.Name) else table.attr if isinstance(table, ast.Attribute) else None
    return f"{name}[]" if name else None


def _registry_lookup(value: ast.expr) -> bool:
    """``TABLE[key]``, ``TABLE.get(key)`` or ``self.table[key]``: a lookup that may pick a class from a registry."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "get":
        value = value.func.value
    elif isinstance(value, ast.Subscript) and not isinstance(value.slice, ast.Slice):
        value = value.value
    else:
        return False
    return isinstance(value, ast.Name) or (isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name))
