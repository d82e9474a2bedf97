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
from flashcheck.verifier.index import ClassInfo, FunctionInfo, ModuleInfo, descendants, store_receiver, with_bases
from flashcheck.verifier.instances import argument

if TYPE_CHECKING:
    from flashcheck.verifier.registries import Registries

__all__ = ["class_values", "module_values"]

_MAX_DEPTH = 4
Via = tuple[tuple[ast.Call, FunctionInfo], ...]  # the calls (and their functions) a factory was reached through
_MAX_NAMES = 16  # module names one import may spell
_UNKNOWN = "\0"  # a part of a module name the analysis cannot spell


def class_values(
    project: Registries, expr: ast.expr, fn: FunctionInfo, depth: int = 0, via: Via | None = None
) -> list[ClassInfo]:
    """The project classes `expr`, an expression that holds a class, may be: a class named, each class a factory
    returns (``get_backend_cls(name)``), a local bound to one, either branch of a conditional, a registry pick, a
    member of a module imported by name; empty when unknown."""
    if depth > _MAX_DEPTH:
        return []
    memo = project._class_values if via is None else None  # asked again by each attribute and call reaching it
    if memo is not None and (expr, id(fn), depth) in memo:
        return memo[expr, id(fn), depth]
    cuts = project.cuts
    found: dict[int, ClassInfo] = {}
    for value, where in _values(expr, fn):
        for c in _classes(project, value, where, depth, via):
            found[id(c)] = c
    out = list(found.values())[:_MAX_NAMES]
    if memo is not None and project.cuts == cuts:  # not cut short by a recursion guard
        memo[expr, id(fn), depth] = out
    return out


def _values(expr: ast.expr, fn: FunctionInfo) -> list[tuple[ast.expr, FunctionInfo]]:
    """`expr` itself, or what a local name without a definition of its own is bound to (each branch of a
    conditional, each operand of ``or``: ``sys.modules.get(name) or __import__(name)``)."""
    if isinstance(expr, ast.Name) and expr.id not in fn.local_defs and expr.id in fn.local_assigns:
        bound = fn.local_assigns[expr.id][:4]
    else:
        bound = [expr]
    either = [e for v in bound for e in (v.values if isinstance(v, ast.BoolOp) and isinstance(v.op, ast.Or) else [v])]
    return [(b, fn) for v in either for b in branches(v)]


def _classes(project: Registries, value: ast.expr, fn: FunctionInfo, depth: int, via: Via | None) -> list[ClassInfo]:
    if isinstance(value, ast.Name | ast.Attribute):
        named = project.resolve_def(value, fn)
        if isinstance(named, ClassInfo):
            return [named]
        if named is None and isinstance(value, ast.Attribute):  # module.BACKEND_CLS of a module imported by name
            members = _members(project, module_values(project, value.value, fn, depth + 1, via), value.attr)
            owner = project.instance_type(value.value, fn) if not members else None
            stored = [vw for c in with_bases(owner) for vw in c.attr_assigns.get(value.attr, [])] if owner else []
            return members or [c for v, w in stored[:4] for c in class_values(project, v, w, depth + 1, via)]
        return []
    if isinstance(value, ast.Subscript):
        return project.registry_classes(value, fn)  # BACKENDS[name]
    if not isinstance(value, ast.Call):
        return []
    picked = project.registry_classes(value, fn)  # BACKENDS.get(name)
    if picked:
        return picked
    if isinstance(value.func, ast.Name) and value.func.id == "getattr" and len(value.args) >= 2:
        names = [n for n in _spelled(project, value.args[1], fn, 0, via) if _UNKNOWN not in n]  # getattr(m, "Cls")
        modules = module_values(project, value.args[0], fn, depth + 1, via) if names else []
        return [c for n in names for c in _members(project, modules, n)]
    factory = project.resolve_def(value.func, fn) if isinstance(value.func, ast.Name | ast.Attribute) else None
    factories = [factory] if isinstance(factory, FunctionInfo) else []
    if factory is None and isinstance(value.func, ast.Attribute):  # backend_cls.metadata_cls(): the classmethod of
        held = class_values(project, value.func.value, fn, depth + 1, via)  # each class the receiver holds
        factories = [m for c in held if (m := project.method(c, value.func.attr)) is not None]
    return [
        c
        for f in factories
        for r in f.returns[:8]
        for c in class_values(project, r, f, depth + 1, (*(via or ()), (value, fn)))
    ]


def _members(project: Registries, modules: list[ModuleInfo], attr: str) -> list[ClassInfo]:
    found = [project.lookup(f"{m.name}.{attr}") for m in modules]
    return [c for c in found if isinstance(c, ClassInfo)]


def module_values(
    project: Registries, expr: ast.expr, fn: FunctionInfo, depth: int = 0, via: Via | None = None
) -> list[ModuleInfo]:
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
        if not (isinstance(value, ast.Call | ast.Subscript)):
            continue
        loaded = _loaded_name(value, where)  # __import__(name), sys.modules[name], sys.modules.get(name)
        if loaded is not None:
            for name in _spelled(project, loaded, where, 0, via):
                found.update((id(m), m) for m in _imported(project, name, None))
            continue
        factory = project.resolve_def(value.func, where) if isinstance(value, ast.Call) else None
        if isinstance(factory, FunctionInfo) and isinstance(value, ast.Call):  # import_plugin(name): what it returns
            for r in factory.returns[:4]:
                found.update(
                    (id(m), m) for m in module_values(project, r, factory, depth + 1, (*(via or ()), (value, where)))
                )
            continue
        if not isinstance(value, ast.Call) or not value.args:
            continue
        if imported_name(value.func, where, "importlib") != "importlib.import_module":
            continue
        package = (
            value.args[1]
            if len(value.args) > 1
            else next((k.value for k in value.keywords if k.arg == "package"), None)
        )
        for name in _spelled(project, value.args[0], where, 0, via):
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


def _spelled(
    project: Registries, expr: ast.expr, fn: FunctionInfo, depth: int = 0, via: Via | None = None
) -> list[str]:
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
        spelled = [_spelled(project, p, fn, depth + 1, via) for p in parts]
        return ["".join(t) for t in itertools.islice(itertools.product(*spelled), _MAX_NAMES)]
    split = _split_item(expr, fn)
    if split is not None:  # module_name = qualname.rsplit(".", 1)[0]; mod, _, cls = spec.partition(":")
        text, i = split
        return [
            parts[i] if -len(parts) <= i < len(parts) else _UNKNOWN
            for whole in _spelled(project, text.func.value, fn, depth + 1, via)  # type: ignore[attr-defined]
            for parts in [_split(whole, text)]
        ][:_MAX_NAMES]
    key = expr.slice if isinstance(expr, ast.Subscript) else None
    if isinstance(key, ast.Constant) and isinstance(key.value, str):  # table["sampler"] of QUALNAMES[plat][mode]
        assert isinstance(expr, ast.Subscript)
        keyed = [
            v.value
            for d in _dict_roots(project, expr.value, fn)
            for node in ast.walk(d)
            if isinstance(node, ast.Dict)
            for k, v in zip(node.keys, node.values, strict=True)
            if isinstance(k, ast.Constant) and k.value == key.value
            if isinstance(v, ast.Constant) and isinstance(v.value, str)
        ]
        if keyed:
            return list(dict.fromkeys(keyed))[:_MAX_NAMES]
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
        passed: list[str] = []  # extra_class("spare"): what each caller passes, or the one call it came through
        last = via[-1] if via else None  # the call this factory was reached through, if it calls this function
        callers = [(last[1], last[0])] if last is not None and project.resolve_def(last[0].func, last[1]) is fn else []
        outer = via[:-1] if callers and via else None
        callers = callers or project.callers(fn)[:8]
        for caller, call in callers:
            arg = argument(call, fn, expr.id)
            passed += _spelled(project, arg, caller, depth + 1, outer) if arg is not None else [_UNKNOWN]
        return list(dict.fromkeys(passed))[:_MAX_NAMES] if callers else [_UNKNOWN]
    if isinstance(expr, ast.Name):
        values = fn.local_assigns.get(expr.id) or [v for v, _ in project.global_values(fn.module, expr.id)]
        consts = [v.value for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
        return consts[:_MAX_NAMES] if consts and len(consts) == len(values) else [_UNKNOWN]
    active = project._spelling_fields  # typing the owner may spell the same field again
    if isinstance(expr, ast.Attribute) and id(expr) in active:
        project.cuts += 1  # cut short: what depends on this answer is not kept in a memo
    elif isinstance(expr, ast.Attribute):
        active.add(id(expr))
        try:
            owner = project.instance_type(expr.value, fn)
            if owner is not None:  # cfg.backend_cls of a config object
                return _field_strings(project, owner, expr.attr, depth)
        finally:
            active.discard(id(expr))
    return [_UNKNOWN]


def _field_strings(project: Registries, owner: ClassInfo, attr: str, depth: int) -> list[str]:
    """The strings a field `attr` of an object of class `owner` may hold: its class-level default (a dataclass
    field's, a subclass's class attribute), what the class and other code store there, and what constructor calls of
    the class pass under its name (keyword arguments only: a spread or positional one is not read); `_UNKNOWN` where
    none is known."""
    family = [*with_bases(owner), *descendants(owner)]  # cls.impl_qualname in a base: any subclass's too
    values = [(v, where) for c in family for v, where in c.attr_assigns.get(attr, [])]
    values += [  # runner.cfg.backend_cls = "..." on an object of the class (not on any object's such attribute)
        (v, w)
        for v, w in project.attr_stores.get(attr, [])[:16]
        if (r := store_receiver(w, v, attr)) is not None and owner in with_bases(project.instance_type(r, w, 1))
    ]
    built = project.calls_by_name().get(owner.name, [])  # EngineConfig(backend_cls=...), m.EngineConfig(...)
    values += [(kw.value, f) for f, c in built for kw in c.keywords if kw.arg == attr]
    found = [t for v, where in values[:_MAX_NAMES] for t in _spelled(project, v, where, depth + 1)]
    return list(dict.fromkeys(found))[:_MAX_NAMES] if found else [_UNKNOWN]


_SPLITS = frozenset({"split", "rsplit", "partition", "rpartition"})


def _split_item(expr: ast.expr, fn: FunctionInfo) -> tuple[ast.Call, int] | None:
    """``(s.rsplit(".", 1), 0)`` for item 0 of a string split with constant arguments, written as an item
    (``s.rsplit(".", 1)[0]``) or unpacked into a name (``head, tail = s.rsplit(".", 1)``)."""
    if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant) and isinstance(expr.slice.value, int):
        call, i = expr.value, expr.slice.value
    elif isinstance(expr, ast.Name) and expr.id not in fn.local_assigns:
        unpacked = [
            (a.value, t.elts.index(e))
            for a in fn.assigns
            if isinstance(a, ast.Assign)
            for t in a.targets
            if isinstance(t, ast.Tuple)
            for e in t.elts
            if isinstance(e, ast.Name) and e.id == expr.id
        ]
        if len(unpacked) != 1:
            return None
        call, i = unpacked[0]
    else:
        return None
    ok = (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr in _SPLITS
        and all(isinstance(a, ast.Constant) for a in call.args)
        and not call.keywords
    )
    return (call, i) if ok and isinstance(call, ast.Call) else None


def _split(text: str, call: ast.Call) -> list[str]:
    """`text` split as `call` splits (its method and constant arguments); a string with an unknown part is one
    unknown part."""
    if _UNKNOWN in text:
        return [_UNKNOWN]
    assert isinstance(call.func, ast.Attribute)
    args = [a.value for a in call.args if isinstance(a, ast.Constant)]
    try:
        return list(getattr(text, call.func.attr)(*args))
    except (TypeError, ValueError):
        return [_UNKNOWN]


def _loaded_name(value: ast.expr, fn: FunctionInfo) -> ast.expr | None:
    """The module name an import by name loads: ``__import__(name, ...)``, ``sys.modules[name]``,
    ``sys.modules.get(name)``."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "__import__":
        return value.args[0] if value.args else None
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "get":
        table, key = value.func.value, value.args[0] if value.args else None
    elif isinstance(value, ast.Subscript):
        table, key = value.value, value.slice
    else:
        return None
    return key if imported_name(table, fn, "sys") == "sys.modules" else None


def _dict_roots(project: Registries, expr: ast.expr, fn: FunctionInfo, depth: int = 0) -> list[ast.Dict]:
    """The dict literals a lookup chain starts from: through items (``QUALNAMES[plat][mode]``), names bound once and
    module globals, and the functions that return the lookup (``table = component_table(cfg)``)."""
    if depth > _MAX_DEPTH:
        return []
    if isinstance(expr, ast.Dict):
        return [expr]
    if isinstance(expr, ast.Subscript):
        return _dict_roots(project, expr.value, fn, depth)  # items of items: one lookup chain
    if isinstance(expr, ast.Name):
        local = fn.local_assigns.get(expr.id)
        bound = [(v, fn) for v in local] if local else project.global_values(fn.module, expr.id)
        return [d for v, w in bound[:4] for d in _dict_roots(project, v, w, depth + 1)]
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name | ast.Attribute):
        made = project.resolve_def(expr.func, fn)
        if isinstance(made, FunctionInfo):
            return [d for r in made.returns[:4] for d in _dict_roots(project, r, made, depth + 1)]
    return []
