"""Descriptors: a class body that binds an attribute to an object whose class defines ``__get__``/``__set__``
(``kv_indptr = DeviceBuffer("max_bs", extra=1)``, ``host_seq_lens = HostView("seq_lens")``) runs that method
whenever the attribute is read (written) on an instance: ``batch.host_seq_lens`` calls ``HostView.__get__``. The
call graph takes such a read for a call of the getter (and of its overrides in the descriptor's subclasses: what
``self._allocate(obj)`` runs there), so what the getter does happens where the attribute is read. Part of
`flashcheck.verifier.project.Project`'s call graph.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from flashcheck.verifier.dispatch import resolution_order
from flashcheck.verifier.index import ClassInfo, FunctionInfo, owner_of, with_bases

if TYPE_CHECKING:
    from flashcheck.verifier.project import Project

__all__ = ["descriptor_calls"]

_HOOKS = {ast.Load: "__get__", ast.Store: "__set__"}


def descriptor_calls(project: Project, fn: FunctionInfo) -> list[tuple[FunctionInfo, ast.Call]]:
    """The descriptor methods `fn` runs by reading or writing attributes of objects whose class binds them, each
    with a call made up at the attribute (``obj.attr.__get__()``: the site, with no arguments bound)."""
    index = _index(project)
    if not index:
        return []
    out: list[tuple[FunctionInfo, ast.Call]] = []
    for node in fn.attributes:
        held = index.get(node.attr)
        hook = _HOOKS.get(type(node.ctx)) if held else None
        if hook is None or held is None:
            continue
        receiver = node.value
        is_self = isinstance(receiver, ast.Name) and receiver.id == "self"
        cls = owner_of(fn).cls if is_self else project.instance_type(receiver, fn)
        if cls is None:
            continue
        family = {id(c) for c in with_bases(cls)} | ({id(c) for c in cls.subclasses} if is_self else set())
        winner = _binder(project, cls, node.attr)  # the class whose binding an instance of cls sees
        for owner, desc in held:
            if id(owner) not in family or (winner is not None and winner is not owner and not is_self):
                continue
            if hook == "__get__" and project.method(desc, "__set__") is None and _instance_stores(cls, node.attr):
                continue  # a non-data descriptor: the instance's own attribute (self.x = ...) wins
            method = project.method(desc, hook)
            if method is None:
                continue
            call = ast.copy_location(ast.Call(ast.Attribute(node, hook, ast.Load()), [], []), node)
            out.append((method, call))
            out += [(m, call) for m in project.overrides(desc, hook)]
    return out


def _index(project: Project) -> dict[str, list[tuple[ClassInfo, ClassInfo]]]:
    """Attribute name -> (the class whose body binds it, the descriptor's class), for class-body bindings to an
    instance of a project class that defines ``__get__`` or ``__set__``; built once per project."""
    found = project.descriptor_index
    if found is not None:
        return found
    found = {}
    for ci in project.classes.values():
        for stmt in ci.node.body:
            value: ast.expr | None
            if isinstance(stmt, ast.Assign):
                value, targets = stmt.value, stmt.targets
            elif isinstance(stmt, ast.AnnAssign):
                value, targets = stmt.value, [stmt.target]
            else:
                continue
            if not isinstance(value, ast.Call) or not isinstance(value.func, ast.Name | ast.Attribute):
                continue
            desc = project.resolve_def(value.func, ci.module.body) if ci.module.body is not None else None
            if not isinstance(desc, ClassInfo) or not any(project.method(desc, h) for h in _HOOKS.values()):
                continue
            for t in targets:
                if isinstance(t, ast.Name):
                    found.setdefault(t.id, []).append((ci, desc))
    project.descriptor_index = found
    return found


def _binder(project: Project, cls: ClassInfo, attr: str) -> ClassInfo | None:
    """The first class in `cls`'s resolution order whose body binds `attr` (a class attribute, a method or a
    property): the binding an instance of `cls` sees."""
    for c in resolution_order(cls, {}):
        if attr in c.methods or any(_binds(stmt, attr) for stmt in c.node.body):
            return c
    return None


def _binds(stmt: ast.stmt, attr: str) -> bool:
    if isinstance(stmt, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == attr for t in stmt.targets)
    if isinstance(stmt, ast.AnnAssign):
        return isinstance(stmt.target, ast.Name) and stmt.target.id == attr and stmt.value is not None
    return False


def _instance_stores(cls: ClassInfo, attr: str) -> bool:
    """Whether methods of `cls` or its bases store ``self.attr`` (not the class body's own binding)."""
    return any(
        where.cls is not None and not isinstance(where.node, ast.Module)
        for c in with_bases(cls)
        for _, where in c.attr_assigns.get(attr, [])
    )
