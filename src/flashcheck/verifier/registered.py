"""Callbacks kept in an object's list and run by one of its methods: ``hooks.register(self.metrics.on_step_end)``
appends the callable (also wrapped: ``weakref.WeakMethod(method)``, ``weakref.ref(fn)``, ``functools.partial(f,
...)``) to ``self._hooks``, and ``hooks.fire(batch, out)`` calls each item (``for h in self._hooks: h(...)``, also
through a dereference: ``hook = ref(); hook(...)``). A call of such a method runs the callables registered on the
same object, told apart by where the object is kept (``self.step_end_hooks`` and ``self.shutdown_hooks`` are two
registries of one class: firing one does not run the other's hooks); where the object's place is unknown, every
callable registered on an object of that class. The forward hooks of ``torch.nn.Module`` are such callbacks too:
``mod.register_forward_pre_hook(hook)`` (or ``register_forward_hook``) on an object of a project class runs `hook`
whenever that module's ``forward`` runs (`module_hooks`). Part of `flashcheck.verifier.project.Project`'s call
graph.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from flashcheck.verifier.astutil import dotted
from flashcheck.verifier.index import ClassInfo, FunctionInfo, owner_of, with_bases

if TYPE_CHECKING:
    from flashcheck.verifier.project import Project

__all__ = ["module_hooks", "registered_callables"]

_ADDERS = frozenset({"append", "add", "insert", "appendleft"})
_WRAPPERS = frozenset({"WeakMethod", "ref", "partial", "proxy"})  # weakref.WeakMethod(m), functools.partial(f, ...)
_MAX = 16
_MODULE_HOOKS = ("register_forward_pre_hook", "register_forward_hook")


def registered_callables(
    project: Project, call: ast.Call, fn: FunctionInfo, method: FunctionInfo
) -> list[FunctionInfo]:
    """The project functions that `call` (a call of `method`, one that runs the items of a list attribute of its
    object) runs through them: what calls of the object's registering methods put there, on an object kept where
    `call`'s receiver is (every such object where that place is unknown)."""
    cls = method.cls
    if cls is None or not isinstance(call.func, ast.Attribute):
        return []
    lists = project.dispatched_lists.get(id(method))
    if lists is None:
        lists = project.dispatched_lists[id(method)] = _dispatched(method)
    if not lists:
        return []
    place = _place(call.func.value, fn)
    found: dict[int, FunctionInfo] = {}
    for reg, index in _registering(project, cls, lists):
        for caller, reg_call in project.callers(reg)[:_MAX]:
            if not isinstance(reg_call.func, ast.Attribute):
                continue
            other = _place(reg_call.func.value, caller)
            if place is not None and (other is None or not _same_place(place, other)):
                continue  # registered on another object (self.shutdown_hooks), or on one the code does not name
            arg = reg_call.args[index] if index < len(reg_call.args) else None
            for f in project.callables(_unwrapped(arg), caller, partials=True) if arg is not None else ():
                found[id(f)] = f
    return list(found.values())[:_MAX]


def _place(receiver: ast.expr, fn: FunctionInfo) -> tuple[ClassInfo | None, str] | None:
    """Where an object is kept, as far as one function's code says: ``self.step_end_hooks`` in a method of
    ``ModelRunner`` -> (ModelRunner, "step_end_hooks"); None for anything else."""
    if isinstance(receiver, ast.Attribute) and isinstance(receiver.value, ast.Name) and receiver.value.id == "self":
        return (owner_of(fn).cls, receiver.attr)
    return None


def _same_place(a: tuple[ClassInfo | None, str], b: tuple[ClassInfo | None, str]) -> bool:
    """The same attribute of objects of one class family (a base's ``__init__`` registers on ``self.hooks``, the
    subclass's ``step`` fires ``self.hooks``)."""
    if a[1] != b[1]:
        return False
    if a[0] is None or b[0] is None:
        return a[0] is b[0]
    return a[0] in with_bases(b[0]) or b[0] in with_bases(a[0])


def _dispatched(method: FunctionInfo) -> set[str]:
    """The list attributes of ``self`` whose items `method` calls: ``for h in self._hooks: h(...)``, also over
    ``list(self._hooks)``/``tuple(...)``/``.values()``/``.copy()``, and an item dereferenced first
    (``hook = ref()``)."""
    out: set[str] = set()
    for name, containers in method.loop_vars.items():
        attrs = [a for c in containers if (a := _self_list(c)) is not None]
        if not attrs:
            continue
        derefs = {t for t, vs in method.local_assigns.items() for v in vs if _calls_name(v, name)}
        if any(isinstance(c.func, ast.Name) and c.func.id in ({name} | derefs) for c in method.calls):
            out.update(attrs)
    return out


def _calls_name(value: ast.expr, name: str) -> bool:
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == name


def _self_list(container: ast.expr) -> str | None:
    """``self._hooks`` of ``self._hooks``, ``list(self._hooks)``, ``self._hooks.values()``, ``self._hooks.copy()``."""
    if isinstance(container, ast.Call):
        f = container.func
        if isinstance(f, ast.Name) and f.id in ("list", "tuple", "reversed") and container.args:
            container = container.args[0]
        elif isinstance(f, ast.Attribute) and f.attr in ("values", "copy"):
            container = f.value
    if isinstance(container, ast.Attribute) and isinstance(container.value, ast.Name) and container.value.id == "self":
        return container.attr
    return None


def _registering(project: Project, cls: ClassInfo, lists: set[str]) -> list[tuple[FunctionInfo, int]]:
    """The methods of `cls` (and its bases) that add a parameter to one of `lists`, with its position in a call of
    the method (``self`` not counted)."""
    out: list[tuple[FunctionInfo, int]] = []
    for c in with_bases(cls):
        for m in c.methods.values():
            params = [p for p in m.params if p not in ("self", "cls")]
            for call in m.calls:
                f = call.func
                if not (isinstance(f, ast.Attribute) and f.attr in _ADDERS and call.args):
                    continue
                if _self_list(f.value) not in lists:
                    continue
                added = _unwrapped(call.args[-1])
                if isinstance(added, ast.Name) and added.id in params:
                    out.append((m, params.index(added.id)))
    return out


def _unwrapped(value: ast.expr) -> ast.expr:
    """The callable inside ``weakref.WeakMethod(m, cb)``, ``weakref.ref(f)``, ``functools.partial(f, ...)``."""
    while isinstance(value, ast.Call) and value.args and (dotted(value.func) or "").rsplit(".", 1)[-1] in _WRAPPERS:
        value = value.args[0]
    return value


def module_hooks(project: Project, fn: FunctionInfo) -> list[tuple[FunctionInfo, ast.Call]]:
    """The hooks a module's `fn` (its ``forward``) runs around itself: the callables handed to
    ``register_forward_pre_hook``/``register_forward_hook`` of an object of its class (or of a subclass or a base:
    the object may be either), each with a call made up at `fn` (no arguments bound: torch passes the module and its
    inputs)."""
    if fn.name != "forward" or fn.cls is None:
        return []
    index = project.module_hook_index
    if index is None:
        index = project.module_hook_index = _hook_index(project)
    out: list[tuple[FunctionInfo, ast.Call]] = []
    family = {id(c) for c in with_bases(fn.cls)}
    for cls, hook, caller in index:
        if id(cls) in family or fn.cls in with_bases(cls):
            # the call torch makes: no name of `fn`'s scope (the hook expression belongs to the registering function)
            call = ast.copy_location(ast.Call(ast.Name("<forward hook>", ast.Load()), [], []), fn.node)
            out += [(f, call) for f in project.callables(_unwrapped(hook), caller, partials=True)]
    return out[:_MAX]


def _hook_index(project: Project) -> list[tuple[ClassInfo, ast.expr, FunctionInfo]]:
    """Each forward hook registered on an object of a known project class: (the class, the hook, where)."""
    by_name = project.calls_by_name()
    out: list[tuple[ClassInfo, ast.expr, FunctionInfo]] = []
    for name in _MODULE_HOOKS:
        for caller, call in by_name.get(name, []):
            if isinstance(call.func, ast.Attribute) and call.args:
                out += [(c, call.args[0], caller) for c in project.object_classes(call.func.value, caller)]
    return out
