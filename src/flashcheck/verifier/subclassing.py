"""Classes that configure and register themselves as they are defined: the keywords of a class statement handed to a
base's ``__init_subclass__`` (``class Trtllm(Backend, name="trtllm-gen", decode_backend="trtllm-gen")`` with
``cls.decode_backend = decode_backend`` there: a class attribute of ``Trtllm``), and the registries that
``__init_subclass__`` or a metaclass's ``__new__``/``__init__`` fill with each new class (``Backend._registry[name] =
cls``, ``mcls.kinds[kind] = cls``), so that a lookup in one (``cls._registry[name](cfg)``) builds any of them. Part of
`flashcheck.verifier.project.Project`'s linking and of `flashcheck.verifier.registries`."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable

from flashcheck.verifier.index import ClassInfo, FunctionInfo, descendants

__all__ = ["link_class_keywords", "method_aliases", "self_registered"]

_REGISTERING = ("__init_subclass__", "__new__", "__init__")


def link_class_keywords(classes: Iterable[ClassInfo], method: Callable[[ClassInfo, str], FunctionInfo | None]) -> None:
    """Record, as class attributes, what a class statement's keywords set through the ``__init_subclass__`` of its
    bases: ``cls.<attr> = <parameter>`` there binds ``<attr>`` of the new class to the keyword's value."""
    for ci in classes:
        given = {k.arg: k.value for k in ci.node.keywords if k.arg is not None and k.arg != "metaclass"}
        body = ci.module.body
        if not given or body is None:
            continue
        hook = next((m for b in ci.bases if (m := method(b, "__init_subclass__")) is not None), None)
        for attr, param in _class_stores(hook) if hook is not None else ():
            if param in given:
                ci.attr_assigns.setdefault(attr, []).append((given[param], body))


def method_aliases(
    classes: Iterable[ClassInfo], resolve: Callable[[ast.expr, FunctionInfo], object]
) -> dict[int, dict[str, FunctionInfo]]:
    """Methods a class body binds by name to a function defined elsewhere (``forward_extend =
    FlashInferBackend.forward_extend``, ``run = _run_impl``): by id(class), name -> the function. Python resolves
    them on the class like its own methods, ahead of a mixin's that comes later in the order."""
    found: dict[int, dict[str, FunctionInfo]] = {}
    for ci in classes:
        body = ci.module.body
        for stmt in ci.node.body if body is not None else ():
            if not (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Name | ast.Attribute)):
                continue
            names = [t.id for t in stmt.targets if isinstance(t, ast.Name) and t.id not in ci.methods]
            target = resolve(stmt.value, body) if names and body is not None else None
            if isinstance(target, FunctionInfo):
                found.setdefault(id(ci), {}).update((n, target) for n in names)
    return found


def self_registered(owner: ClassInfo, attr: str, classes: Iterable[ClassInfo]) -> list[ClassInfo]:
    """The classes a registry attribute `attr` of `owner` holds when the classes register themselves into it: every
    subclass of `owner` where its ``__init_subclass__`` stores ``cls`` under a key (``Backend._registry[name] =
    cls``), every class made by `owner` where `owner` is a metaclass whose ``__new__``/``__init__`` stores the new
    class (``mcls.kinds[kind] = cls``); empty otherwise."""
    found: list[ClassInfo] = []
    for name in _REGISTERING:
        fn = owner.methods.get(name)
        key = _stored_class_key(fn, attr) if fn is not None else None
        if fn is None or key is None:
            continue
        if name == "__init_subclass__":
            found += descendants(owner)
        elif any(isinstance(b, ast.Name) and b.id == "type" for b in owner.node.bases):  # a metaclass
            made = [c for c in classes if any(_names(k.value, owner) for k in c.node.keywords if k.arg == "metaclass")]
            found += [d for c in made for d in [c, *descendants(c)]]
        if key in fn.params:  # filed under a class keyword (kind=...): the classes that pass one
            found = [c for c in found if any(k.arg == key for k in c.node.keywords)]
    return list({id(c): c for c in found}.values())


def _class_stores(fn: FunctionInfo) -> list[tuple[str, str]]:
    """``(attr, parameter)`` for each ``cls.attr = parameter`` (or ``setattr(cls, "attr", parameter)``) in `fn`."""
    out: list[tuple[str, str]] = []
    for a in fn.assigns:
        if isinstance(a, ast.Assign) and isinstance(a.value, ast.Name) and a.value.id in fn.params:
            out += [(t.attr, a.value.id) for t in a.targets if isinstance(t, ast.Attribute) and _is_cls(t.value)]
    for c in fn.calls:  # setattr(cls, "decode_backend", decode_backend)
        if not (isinstance(c.func, ast.Name) and c.func.id == "setattr" and len(c.args) == 3):
            continue
        target, key, value = c.args
        if _is_cls(target) and isinstance(key, ast.Constant) and isinstance(key.value, str):
            out += [(key.value, value.id)] if isinstance(value, ast.Name) else []
    return out


def _stored_class_key(fn: FunctionInfo, attr: str) -> str | None:
    """The key under which `fn` stores the class being made in a registry named `attr` (``X.attr[k] = cls``: ``k``'s
    name, or ``""`` for another key expression); None where it stores none."""
    made = {"cls"} | {  # cls = super().__new__(mcls, name, bases, ns) in a metaclass
        name for name, values in fn.local_assigns.items() if any(_new_call(v) for v in values)
    }
    for a in fn.assigns:
        if not isinstance(a, ast.Assign) or not (isinstance(a.value, ast.Name) and a.value.id in made):
            continue
        for t in a.targets:
            if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Attribute) and t.value.attr == attr:
                return t.slice.id if isinstance(t.slice, ast.Name) else ""
    return None


def _is_cls(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "cls"


def _names(node: ast.expr, cls: ClassInfo) -> bool:
    return (isinstance(node, ast.Name) and node.id == cls.name) or (
        isinstance(node, ast.Attribute) and node.attr == cls.name
    )


def _new_call(value: ast.expr) -> bool:
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "__new__"
