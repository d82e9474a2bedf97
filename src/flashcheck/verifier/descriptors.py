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
        for owner, desc in held:
            if id(owner) not in family:
                continue
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
