"""The classes of the objects a factory call may give, with the ``isinstance`` tests on its arguments decided.

Engines pick a per-layer strategy object through a configuration's factory method
(``self.quant_method = quant_config.get_quant_method(self, prefix)``), each configuration class overriding it with
``if isinstance(layer, LinearBase): return Fp8LinearMethod(self)`` / ``if isinstance(layer, FusedMoE): return
Fp8MoEMethod(self, layer)``. Called from a linear layer, no override can give an MoE method, so the layer's
``self.quant_method.apply(...)`` runs only linear methods' ``apply``. `factory_classes` answers, for such a call, the
project classes its value may be an instance of: every function the call may run (each override of a method on a
receiver declared with a base class), its ``return`` statements in the branches an ``isinstance`` test of a
parameter leaves possible for the argument passed (the caller's object, the classes a call builds, a class passed as
a value and called), through nested factory calls (``return QuarkMoEMethod.get_moe_method(...)``,
``return self._linear(layer)``) a few calls deep. A return the analysis cannot type makes the answer unknown (None),
and the caller then keeps its wider answer; ``return None`` and a function that ends without returning give nothing.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from flashcheck.verifier.astutil import SCOPES, dotted, is_abstract, is_none, own_nodes
from flashcheck.verifier.index import ClassInfo, FunctionInfo, derives, descendants, with_bases
from flashcheck.verifier.instances import argument

if TYPE_CHECKING:
    from flashcheck.verifier.dispatch import InstanceCalls

__all__ = ["Objects", "factory_classes"]

_DEPTH = 4  # nested factory calls followed
_TARGETS = 32  # functions one call may run (overrides): more, and the answer is unknown
_BUILDERS = frozenset({"__init__", "__new__", "__post_init__", "__attrs_post_init__"})


@dataclass(frozen=True)
class Objects:
    """What a parameter holds: instances of `classes` (exactly those classes with `exact`, else also of their
    subclasses), or with `called` the classes themselves (``linear_method_cls=Fp8LinearMethod``)."""

    classes: tuple[ClassInfo, ...]
    exact: bool = False
    called: bool = False


Env = Mapping[str, Objects]


def factory_classes(
    project: InstanceCalls, value: ast.expr, fn: FunctionInfo, self_class: ClassInfo | None
) -> list[ClassInfo] | None:
    """The project classes `value` (a factory call, a local bound to one, a conditional expression of them; in
    `fn`, where ``self`` is of class `self_class` or a subclass) may be an instance of; None when some function it
    may run returns what the analysis cannot type."""
    own = self_class if self_class is not None else fn.cls
    return _value_classes(project, value, fn, {"self": Objects((own,))} if own is not None else {}, 0)


def _call_classes(
    project: InstanceCalls, call: ast.Call, fn: FunctionInfo, env: Env, depth: int
) -> list[ClassInfo] | None:
    if depth > _DEPTH or id(call) in _ACTIVE:  # a factory reached again while typed (through dispatch): unknown
        if id(call) in _ACTIVE:
            project.cuts += 1  # answers that depend on this one are not memoised
        return None
    _ACTIVE.add(id(call))
    try:
        return _targets_classes(project, call, fn, env, depth)
    finally:
        _ACTIVE.discard(id(call))


_ACTIVE: set[int] = set()  # the calls being typed now (one analysis runs per process at a time)


def _targets_classes(
    project: InstanceCalls, call: ast.Call, fn: FunctionInfo, env: Env, depth: int
) -> list[ClassInfo] | None:
    made = project.resolve_def(call.func, fn) if isinstance(call.func, ast.Name | ast.Attribute) else None
    if isinstance(made, ClassInfo):
        return [made]
    if project.registry_held(call.func):  # BACKENDS[name](cfg), cls = BACKENDS.get(name); cls(cfg)
        return project.registry_classes(call.func, fn) or None
    targets = list(dict.fromkeys(project._call_targets(call, fn)))
    if not targets or len(targets) > _TARGETS or any(t.name in _BUILDERS for t in targets):
        return None  # a class the analysis does not name is built (cls.registry[name](ws)): unknown
    found: dict[int, ClassInfo] = {}
    for target in targets:
        if is_abstract(target.node):  # a declaration: what the overrides among the targets return
            chosen = {id(t) for t in targets}
            if target.cls is not None and any(id(o) not in chosen for o in project.overrides(target.cls, target.name)):
                return None  # the call may run an override the targets leave out
            continue
        got = _returned(project, target, _bind(project, call, fn, target, env), depth)
        if got is None:
            return None
        found.update((id(c), c) for c in got)
    return list(found.values())


def _bind(
    project: InstanceCalls, call: ast.Call, fn: FunctionInfo, target: FunctionInfo, env: Env
) -> dict[str, Objects]:
    """What each parameter of `target` holds for `call`: ``self`` the receiver's object (``self.m()``, or an
    object of the target's class), a classmethod's first parameter the class the call names (``Fp8Config.make()``,
    ``cls.make()``; the target's class and its subclasses where the receiver says nothing), the others the objects
    or classes the arguments name."""
    out: dict[str, Objects] = {}
    if isinstance(target.node, ast.Module):
        return out
    names = [a.arg for a in [*target.node.args.posonlyargs, *target.node.args.args]]
    receiver = call.func.value if isinstance(call.func, ast.Attribute) else None
    owner = target.cls
    first = names[0] if names and owner is not None else None
    held = _objects(project, receiver, fn, env) if receiver is not None and first is not None else None
    if owner is not None and first is not None and _is_classmethod(target):
        out[first] = held if held is not None and held.called else Objects((owner,), called=True)
    elif owner is not None and first == "self":
        mine = held is not None and not held.called and all(derives(c, owner) for c in held.classes)
        out["self"] = held if held is not None and mine else Objects((owner,))
    for name in names[1:] if first in out else names:
        arg = _argument(call, target, name)
        held = _objects(project, arg, fn, env) if arg is not None else None
        if held is not None:
            out[name] = held
    return out


def _is_classmethod(fn: FunctionInfo) -> bool:
    return any(dotted(d) == "classmethod" for d in fn.decorators)


def _argument(call: ast.Call, target: FunctionInfo, name: str) -> ast.expr | None:
    if _is_classmethod(target) and not isinstance(target.node, ast.Module):  # Cls.make(layer): after cls
        names = [a.arg for a in [*target.node.args.posonlyargs, *target.node.args.args]][1:]
        args = list(call.args)
        for kw in call.keywords:
            if kw.arg == name:
                return kw.value
        i = names.index(name) if name in names else len(args)
        return args[i] if i < len(args) and not any(isinstance(a, ast.Starred) for a in args[: i + 1]) else None
    return argument(call, target, name)


def _objects(project: InstanceCalls, expr: ast.expr, fn: FunctionInfo, env: Env) -> Objects | None:
    """What `expr` holds: a parameter's `Objects`, a class named as a value, an object built by a class's
    constructor, else an object of the class the analysis types it with."""
    if isinstance(expr, ast.Name) and expr.id in env and expr.id not in fn.local_assigns:
        return env[expr.id]
    ref = project.resolve_def(expr, fn) if isinstance(expr, ast.Name | ast.Attribute) else None
    if isinstance(ref, ClassInfo):
        return Objects((ref,), called=True)
    if isinstance(expr, ast.Call):
        made = project.resolve_def(expr.func, fn) if isinstance(expr.func, ast.Name | ast.Attribute) else None
        if isinstance(made, ClassInfo):
            return Objects((made,), exact=True)
    t = project.instance_type(expr, fn, 1)
    return Objects((t,)) if t is not None else None


def _returned(project: InstanceCalls, target: FunctionInfo, env: Env, depth: int) -> list[ClassInfo] | None:
    """The classes of what `target`'s reachable ``return`` statements give, with `env`'s parameters."""
    if isinstance(target.node, ast.Module):
        return None
    returns, _ = _walk(project, target, target.node.body, env, {})
    found: dict[int, ClassInfo] = {}
    for value, bound in returns:
        got = _value_classes(project, value, target, env, depth, bound)
        if got is None:
            return None
        found.update((id(c), c) for c in got)
    return list(found.values())


# local name -> the values it may hold at a point of one path (a name absent: every value it is assigned)
Bound = dict[str, tuple[ast.expr, ...]]
Returns = list[tuple[ast.expr, Bound | None]]


def _walk(
    project: InstanceCalls, fn: FunctionInfo, body: Iterable[ast.stmt], env: Env, bound: Bound
) -> tuple[Returns, Bound | None]:
    """The return values of the statements that may run, each with what the locals hold there, and what they
    hold at the end of `body` (None when the end cannot be reached)."""
    out: Returns = []
    here: Bound | None = dict(bound)
    for st in body:
        assert here is not None
        if isinstance(st, ast.Return):
            out.append((st.value if st.value is not None else ast.Constant(None), here))
            return out, None
        if isinstance(st, ast.Raise):
            return out, None
        if isinstance(st, ast.Assign | ast.AnnAssign) and st.value is not None:
            targets = st.targets if isinstance(st, ast.Assign) else [st.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    here[t.id] = (st.value,)
                else:
                    _forget(here, t)
        elif isinstance(st, ast.If):
            yes, no = _possible(project, st.test, fn, env)
            on_true, after_true = _walk(project, fn, st.body, env, here) if yes else ([], None)
            on_false, after_false = _walk(project, fn, st.orelse, env, here) if no else ([], None)
            out += on_true + on_false
            here = _merge(after_true, after_false)
            if here is None:
                return out, None
        elif not isinstance(st, SCOPES):  # loops, with, try, match: every return inside may run
            out += [
                (n.value if n.value is not None else ast.Constant(None), None)
                for n in own_nodes(st)
                if isinstance(n, ast.Return)
            ]
            _forget(here, st)
    return out, here


def _forget(bound: Bound, node: ast.AST) -> None:
    """Drop what `bound` says of the names `node` may assign (they may hold any of their values after it)."""
    for n in own_nodes(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            bound.pop(n.id, None)


def _merge(a: Bound | None, b: Bound | None) -> Bound | None:
    """What the locals hold where two paths meet (either may not reach it)."""
    if a is None or b is None:
        return a if b is None else b
    return {k: tuple(dict.fromkeys([*a[k], *b[k]])) for k in a.keys() & b.keys()}


def _possible(project: InstanceCalls, test: ast.expr, fn: FunctionInfo, env: Env) -> tuple[bool, bool]:
    """Whether the test may be true, and whether it may be false, for the parameters' objects in `env`."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        yes, no = _possible(project, test.operand, fn, env)
        return no, yes
    if isinstance(test, ast.BoolOp):
        each = [_possible(project, v, fn, env) for v in test.values]
        if isinstance(test.op, ast.And):  # true only when every part may be; false when any may be
            return all(y for y, _ in each), any(n for _, n in each)
        return any(y for y, _ in each), all(n for _, n in each)
    if (
        isinstance(test, ast.Call)
        and isinstance(test.func, ast.Name)
        and test.func.id == "isinstance"
        and len(test.args) == 2
        and isinstance(test.args[0], ast.Name)
        and test.args[0].id in env
        and test.args[0].id not in fn.local_assigns
    ):
        held = env[test.args[0].id]
        kinds = _classes_named(project, test.args[1], fn)
        if kinds is None or held.called:
            return True, True
        return _may_be(held, kinds), _may_not_be(held, kinds)
    return True, True


def _classes_named(project: InstanceCalls, expr: ast.expr, fn: FunctionInfo) -> list[ClassInfo] | None:
    """The project classes an ``isinstance`` test names (one or a tuple); None when one is not the project's."""
    parts = expr.elts if isinstance(expr, ast.Tuple) else [expr]
    out: list[ClassInfo] = []
    for p in parts:
        ref = project.resolve_def(p, fn) if isinstance(p, ast.Name | ast.Attribute) else None
        if not isinstance(ref, ClassInfo):
            return None
        out.append(ref)
    return out


def _may_be(held: Objects, kinds: list[ClassInfo]) -> bool:
    """Whether an object of `held`'s classes may be an instance of one of `kinds`."""
    for c in held.classes:
        if any(derives(c, k) for k in kinds):
            return True
        if not held.exact and any(derives(k, c) for k in kinds):  # a subclass of c may be one
            return True
    return False


def _may_not_be(held: Objects, kinds: list[ClassInfo]) -> bool:
    """Whether an object of `held`'s classes may be an instance of none of `kinds`."""
    return any(not any(derives(c, k) for k in kinds) for c in held.classes)


def _value_classes(
    project: InstanceCalls, value: ast.expr, fn: FunctionInfo, env: Env, depth: int, bound: Bound | None = None
) -> list[ClassInfo] | None:
    """The classes a returned value may be an instance of (none for ``None``); None when unknown. A local takes the
    values `bound` says it holds on the path, else every value it is assigned."""
    if is_none(value):
        return []
    if isinstance(value, ast.IfExp):
        parts = [_value_classes(project, v, fn, env, depth, bound) for v in (value.body, value.orelse)]
        return None if any(p is None for p in parts) else [c for p in parts for c in p or ()]
    if isinstance(value, ast.Call):
        func = value.func
        if isinstance(func, ast.Name) and func.id in env and func.id not in fn.local_assigns:
            held = env[func.id]  # linear_method_cls(self), cls(...) in a classmethod: the class passed (and the
            if not held.called:  # subclasses of a class the receiver does not name exactly)
                return None
            return [*held.classes, *(d for c in held.classes for d in ([] if held.exact else descendants(c)))]
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in ("self", "cls"):
            kept = _held_classes(project, env.get("self"), func.attr)  # self.LinearMethodCls(self)
            if kept is not None:
                return kept
        return _call_classes(project, value, fn, env, depth + 1)
    if isinstance(value, ast.Name) and value.id in fn.local_assigns:
        on_path = bound.get(value.id) if bound is not None else None
        values = on_path if on_path is not None else fn.local_assigns[value.id]
        if len(values) > 4:
            return None
        parts = [_value_classes(project, v, fn, env, depth) for v in values]
        return None if any(p is None for p in parts) else [c for p in parts for c in p or ()]
    if isinstance(value, ast.Name) and value.id in env:  # a parameter: what the caller handed, when built so
        held = env[value.id]
        return list(held.classes) if held.exact and not held.called else None
    return None  # typed by a declaration at most: an object of that class or a subclass


def _held_classes(project: InstanceCalls, held: Objects | None, name: str) -> list[ClassInfo] | None:
    """The classes an attribute `name` of `held`'s classes may hold, all of them set to project classes: in a
    class body (``LinearMethodCls = Fp8LinearMethod``, the one a class inherits and each subclass's own), by
    ``self.LinearMethodCls = ...`` in their methods, or by ``Config.LinearMethodCls = ...`` anywhere; None when
    one is no project class, or when none is set in a class body."""
    if held is None or held.called:
        return None
    family: dict[int, ClassInfo] = {}
    for c in held.classes:
        family.update((id(k), k) for k in with_bases(c))
        if not held.exact:
            family.update((id(k), k) for k in project.subclasses_of(c))
    values: list[tuple[ast.expr, FunctionInfo | None]] = []
    stores = 0  # every binding of the name in the class bodies, also by tuple targets and loops
    for c in family.values():
        body = (n for top in c.node.body if not isinstance(top, SCOPES) for n in own_nodes(top))
        for st in body:  # also under if/try/for in the class body, not in its methods
            if isinstance(st, ast.Name) and st.id == name and isinstance(st.ctx, ast.Store):
                stores += 1
            if not isinstance(st, ast.Assign | ast.AnnAssign) or st.value is None:
                continue
            names = st.targets if isinstance(st, ast.Assign) else [st.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in names):
                values.append((st.value, c.module.body))
    if not values or stores != len(values):
        return None  # not set in a class body, or also bound in a form the analysis does not read
    for c in family.values():
        values += c.attr_assigns.get(name, [])
    values += project.attr_stores.get(name, [])
    found: dict[int, ClassInfo] = {}
    for value, where in values:
        ref = project.resolve_def(value, where) if isinstance(value, ast.Name | ast.Attribute) else None
        if not isinstance(ref, ClassInfo):
            return None
        found[id(ref)] = ref
    return list(found.values())
