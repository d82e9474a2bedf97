"""Modules imported by name at run time, and the classes a class-valued expression may denote.

Engines pick a backend module from a table and take its class by a fixed attribute: ``module =
importlib.import_module(f".{BACKEND_MODULES[name]}", __package__); return module.BACKEND_CLS`` (SGLang's model
registry reads ``EntryClass`` of each module under a package the same way). `module_values` gives the project modules
such an import may load: each module a constant name, a table's string values or an f-string over them spell, or
every module directly under the package where a part of the name is unknown. `class_values` gives the classes an
expression that holds a class may be (a factory's returns, a local bound to one, a registry pick, a member of such a
module): calling it builds any of them (`flashcheck.verifier.dispatch` reads it for what an attribute holds).
"""

from __future__ import annotations

import ast
import itertools
from typing import TYPE_CHECKING

from flashcheck.verifier.astutil import branches
from flashcheck.verifier.bindings import imported_name
from flashcheck.verifier.index import ClassInfo, FunctionInfo, ModuleInfo
from flashcheck.verifier.instances import argument

if TYPE_CHECKING:
    from flashcheck.verifier.registries import Registries

__all__ = ["class_values", "module_values"]

_MAX_DEPTH = 4
_MAX_NAMES = 16  # module names one import may spell
_UNKNOWN = "\0"  # a part of a module name the analysis cannot spell


def class_values(project: Registries, expr: ast.expr, fn: FunctionInfo, depth: int = 0) -> list[ClassInfo]:
    """The project classes `expr`, an expression that holds a class, may be: a class named, each class a factory
    returns (``get_backend_cls(name)``), a local bound to one, either branch of a conditional, a registry pick, a
    member of a module imported by name; empty when unknown."""
    if depth > _MAX_DEPTH:
        return []
    found: dict[int, ClassInfo] = {}
    for value, where in _values(expr, fn):
        for c in _classes(project, value, where, depth):
            found[id(c)] = c
    return list(found.values())[:_MAX_NAMES]


def _values(expr: ast.expr, fn: FunctionInfo) -> list[tuple[ast.expr, FunctionInfo]]:
    """`expr` itself, or what a local name without a definition of its own is bound to."""
    if isinstance(expr, ast.Name) and expr.id not in fn.local_defs and expr.id in fn.local_assigns:
        return [(b, fn) for v in fn.local_assigns[expr.id][:4] for b in branches(v)]
    return [(b, fn) for b in branches(expr)]


def _classes(project: Registries, value: ast.expr, fn: FunctionInfo, depth: int) -> list[ClassInfo]:
    if isinstance(value, ast.Name | ast.Attribute):
        named = project.resolve_def(value, fn)
        if isinstance(named, ClassInfo):
            return [named]
        if named is None and isinstance(value, ast.Attribute):  # module.BACKEND_CLS of a module imported by name
            return _members(project, module_values(project, value.value, fn, depth + 1), value.attr)
        return []
    if isinstance(value, ast.Subscript):
        return project.registry_classes(value, fn)  # BACKENDS[name]
    if not isinstance(value, ast.Call):
        return []
    picked = project.registry_classes(value, fn)  # BACKENDS.get(name)
    if picked:
        return picked
    if isinstance(value.func, ast.Name) and value.func.id == "getattr" and len(value.args) >= 2:
        name = value.args[1]
        if isinstance(name, ast.Constant) and isinstance(name.value, str):  # getattr(module, "BACKEND_CLS")
            return _members(project, module_values(project, value.args[0], fn, depth + 1), name.value)
        return []
    factory = project.resolve_def(value.func, fn) if isinstance(value.func, ast.Name | ast.Attribute) else None
    if not isinstance(factory, FunctionInfo):
        return []
    return [c for r in factory.returns[:8] for c in class_values(project, r, factory, depth + 1)]


def _members(project: Registries, modules: list[ModuleInfo], attr: str) -> list[ClassInfo]:
    found = [project.lookup(f"{m.name}.{attr}") for m in modules]
    return [c for c in found if isinstance(c, ClassInfo)]


def module_values(project: Registries, expr: ast.expr, fn: FunctionInfo, depth: int = 0) -> list[ModuleInfo]:
    """The project modules `expr` may be: a module named or imported, or a local bound to
    ``importlib.import_module(name, package)`` (each module the name may spell, `_spelled`)."""
    if depth > _MAX_DEPTH:
        return []
    found: dict[int, ModuleInfo] = {}
    for value, where in _values(expr, fn):
        if isinstance(value, ast.Name | ast.Attribute):
            named = project.resolve_def(value, where)
            if isinstance(named, ModuleInfo):
                found[id(named)] = named
            continue
        if not (isinstance(value, ast.Call) and value.args):
            continue
        if imported_name(value.func, where, "importlib") != "importlib.import_module":
            continue
        package = (
            value.args[1]
            if len(value.args) > 1
            else next((k.value for k in value.keywords if k.arg == "package"), None)
        )
        for name in _spelled(project, value.args[0], where):
            for m in _imported(project, name, _package(package, where)):
                found[id(m)] = m
    return list(found.values())[: _MAX_NAMES * 2]


def _package(expr: ast.expr | None, fn: FunctionInfo) -> str | None:
    """The package a relative import starts from: ``__package__``, ``__name__`` (of a package's ``__init__``), a
    constant."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value
    if isinstance(expr, ast.Name) and expr.id in ("__package__", "__name__"):
        mod = fn.module
        if expr.id == "__name__" or mod.source.path.name == "__init__.py":
            return mod.name
        return mod.name.rpartition(".")[0]
    return None


def _imported(project: Registries, name: str, package: str | None) -> list[ModuleInfo]:
    """The modules an ``import_module(name, package)`` may load; a name with an unknown part: every module directly
    under the package that its known head names."""
    if name.startswith("."):
        if package is None:
            return []
        dots = len(name) - len(name.lstrip("."))
        base = package.rsplit(".", dots - 1)[0] if dots > 1 else package
        name = f"{base}.{name[dots:]}" if name[dots:] else base
    if _UNKNOWN not in name:
        found = project.lookup(name)
        return [found] if isinstance(found, ModuleInfo) else []
    head, _, rest = name.partition(_UNKNOWN)
    if "." in rest or not head.endswith("."):
        return []
    parent = project.lookup(head[:-1])
    if not isinstance(parent, ModuleInfo):
        return []
    prefix = parent.name + "."
    return [m for n, m in project.modules.items() if n.startswith(prefix) and "." not in n[len(prefix) :]]


def _spelled(project: Registries, expr: ast.expr, fn: FunctionInfo, depth: int = 0) -> list[str]:
    """The strings `expr` may be: a constant, an f-string or ``+`` of parts, each string value of a table it looks
    up (``BACKEND_MODULES[name]``), a local or global bound to one; `_UNKNOWN` for a part that cannot be spelled."""
    if depth > _MAX_DEPTH:
        return [_UNKNOWN]
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return [expr.value]
    parts: list[ast.expr] = []
    if isinstance(expr, ast.JoinedStr):
        parts = [v.value if isinstance(v, ast.FormattedValue) else v for v in expr.values]
    elif isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        parts = [expr.left, expr.right]
    if parts:
        spelled = [_spelled(project, p, fn, depth + 1) for p in parts]
        return ["".join(t) for t in itertools.islice(itertools.product(*spelled), _MAX_NAMES)]
    if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Name):  # BACKEND_MODULES[name]
        table = project.global_values(fn.module, expr.value.id)
        strings = [
            v.value
            for lit, _ in table
            if isinstance(lit, ast.Dict)
            for v in lit.values
            if isinstance(v, ast.Constant) and isinstance(v.value, str)
        ]
        return strings[:_MAX_NAMES] or [_UNKNOWN]
    if isinstance(expr, ast.Name) and expr.id in fn.params and expr.id not in fn.local_assigns:
        passed: list[str] = []  # extra_class("spare"): what each caller passes
        callers = project.callers(fn)[:8]
        for caller, call in callers:
            arg = argument(call, fn, expr.id)
            passed += _spelled(project, arg, caller, depth + 1) if arg is not None else [_UNKNOWN]
        return list(dict.fromkeys(passed))[:_MAX_NAMES] if callers else [_UNKNOWN]
    if isinstance(expr, ast.Name):
        values = fn.local_assigns.get(expr.id) or [v for v, _ in project.global_values(fn.module, expr.id)]
        consts = [v.value for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
        return consts[:_MAX_NAMES] if consts and len(consts) == len(values) else [_UNKNOWN]
    return [_UNKNOWN]
