"""What a class's members run when used: building an instance (its ``__init__``, or a dataclass's or attrs class's
``__post_init__`` and field hooks), reading a ``@property`` or storing through a setter, and the functions a callable
value names (a bound method kept in an attribute, a ``functools.partial``/``partialmethod``, a kept ``lambda`` and the
calls that pass its arguments, a callable handed in or bound to a local, an object's ``__call__``). Part of
`flashcheck.verifier.project.Project`'s call graph."""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterator
from typing import TYPE_CHECKING

from flashcheck.verifier.astutil import dotted, executed_callable, literal_items, terminal_name
from flashcheck.verifier.bindings import imported_name
from flashcheck.verifier.dispatch import InstanceCalls
from flashcheck.verifier.index import (
    POST_INITS,
    ClassInfo,
    FunctionInfo,
    ModuleInfo,
    lambda_function,
    owner_of,
    positional_names,
    with_bases,
)
from flashcheck.verifier.instances import PROPERTIES, argument

__all__ = ["PARTIALS", "Members", "classmethod_class", "generates_init", "imported_root"]

_CACHED = frozenset({"functools.cached_property", "cached_property"})
PARTIALS = frozenset(
    {"functools.partial", "partial", "functools.partialmethod", "partialmethod", "types.MethodType", "MethodType"}
)


class Members(InstanceCalls):
    """The member half of `flashcheck.verifier.project.Project`."""

    _property_names: frozenset[str] | None
    _methods_by_name: dict[str, list[FunctionInfo]] | None
    _setter_names: frozenset[str]
    _property_cache: dict[int, list[tuple[FunctionInfo, ast.Attribute]]]
    _lambda_callers: dict[int, list[tuple[FunctionInfo, ast.Call]]] | None
    _handoffs: dict[str, list[tuple[FunctionInfo, ast.Call, ast.expr]]] | None

    if TYPE_CHECKING:

        def method(self, ci: ClassInfo, name: str) -> FunctionInfo | None: ...

        def resolve_def(
            self, expr: ast.expr, fn: FunctionInfo | None, depth: int = 0
        ) -> FunctionInfo | ClassInfo | ModuleInfo | None: ...

        def callers(self, fn: FunctionInfo) -> list[tuple[FunctionInfo, ast.Call]]: ...

        def feeding_callers(self, fn: FunctionInfo) -> list[tuple[FunctionInfo, ast.Call]]: ...

        def overrides(self, ci: ClassInfo, name: str, *, setters: bool = False) -> Iterator[FunctionInfo]: ...

    def constructors(self, ci: ClassInfo) -> list[FunctionInfo]:
        """What building an instance of `ci` runs: its ``__init__``, or where a dataclass (or attrs class) generates
        it, the ``__post_init__`` (``__attrs_post_init__``) and the field converters and validators the generated one
        calls."""
        init = self.method(ci, "__init__")
        generated = init is None or (init.cls is not ci and generates_init(ci))
        if init is not None and not generated:
            return [init]
        post = next((m for name in POST_INITS if (m := self.method(ci, name)) is not None), None)
        return ([post] if post is not None else []) + self._field_hooks(ci)

    def _field_hooks(self, ci: ClassInfo) -> list[FunctionInfo]:
        """The converters and validators a generated constructor of `ci` (or a base) runs on its fields:
        ``attrs.field(converter=f, validator=g)`` (also ``attr.ib``), and ``@x.validator`` methods."""
        out: list[FunctionInfo] = []
        for c in with_bases(ci):
            if not generates_init(c):
                continue
            out += [m for m in c.methods.values() if any(_field_hook(d) for d in m.decorators)]
            body = c.module.body
            for stmt in c.node.body if body is not None else ():
                value = stmt.value if isinstance(stmt, ast.AnnAssign | ast.Assign) else None
                for k in value.keywords if isinstance(value, ast.Call) else ():
                    hooks = k.value.elts if isinstance(k.value, ast.List | ast.Tuple) else [k.value]
                    if k.arg in ("converter", "validator") and body is not None:
                        out += [t for h in hooks if isinstance(t := self.resolve_def(h, body), FunctionInfo)]
        return out

    def sole_method(self, name: str) -> FunctionInfo | None:
        """The method a call on a receiver of unknown type runs when exactly one project class defines a method of
        that name and the name is compound (``forward_decode``, ``init_forward_metadata_capture_cuda_graph``; not
        ``run``, ``plan`` or a dunder, which other libraries' objects share)."""
        core = name.strip("_")
        if "_" not in core or name.startswith("__") or name.endswith("_"):
            return None
        if self._methods_by_name is None:
            index: dict[str, list[FunctionInfo]] = {}
            for ci in self.classes.values():
                for m in ci.methods.values():
                    index.setdefault(m.name, []).append(m)
            self._methods_by_name = index
        found = self._methods_by_name.get(name, [])
        return found[0] if len(found) == 1 else None

    def lambda_callers(self) -> dict[int, list[tuple[FunctionInfo, ast.Call]]]:
        """The calls that pass a ``lambda``'s parameters as written, by the id of its function: an entry of a table
        kept in an attribute (``self._steps[fb.mode](fb)`` over ``{"decode": lambda fb: ...}``), an attribute
        (``self.on_step(b)``), a local bound to one, a loop over a literal of them and a loop over a hook list filled
        with them (also through a ``register_*`` method's parameter)."""
        if self._lambda_callers is None:
            found: dict[int, list[tuple[FunctionInfo, ast.Call]]] = {}
            for f in self.all_functions():
                for call in f.calls:
                    for lam in self._called_lambdas(call.func, f):
                        if (g := lambda_function(lam)) is not None:
                            found.setdefault(id(g), []).append((f, call))
            self._lambda_callers = found  # what follows may ask again: it gets the calls found so far
            for f in self.all_functions():  # stage(ctx) of a parameter handed lambdas (reduce(run_stage, STAGES))
                for call in f.calls:
                    func = call.func
                    if isinstance(func, ast.Name) and func.id in f.params and param_default(f, func.id) is None:
                        for g in self.callables(func, f):
                            if g.name == "<lambda>" and (f, call) not in found.setdefault(id(g), []):
                                found[id(g)].append((f, call))
        return self._lambda_callers

    def _called_lambdas(self, func: ast.expr, fn: FunctionInfo) -> list[ast.expr]:
        held: list[ast.expr] = []
        if isinstance(func, ast.Subscript) and isinstance(func.value, ast.Attribute):
            base = func.value
            cls = owner_of(fn).cls if isinstance(base.value, ast.Name) and base.value.id == "self" else None
            held = [e for c in with_bases(cls) for d, _ in c.attr_assigns.get(base.attr, []) for e in literal_items(d)]
        elif isinstance(func, ast.Attribute) and _is_self(func.value):  # self.on_step = lambda b: ...; self.on_step(b)
            cls = owner_of(fn).cls
            held = [v for c in with_bases(cls) for v, _ in c.attr_assigns.get(func.attr, [])]
        elif isinstance(func, ast.Name) and (scope := _param_scope(fn, func.id)) is not None:
            held = [d] if (d := param_default(scope, func.id)) is not None else []  # layout_of=lambda w: ...
        elif isinstance(func, ast.Name):
            held = [v for v in fn.local_assigns.get(func.id, [])]
            held += [e for c in fn.loop_vars.get(func.id, []) if not held for e in literal_items(c)]
            for c in fn.loop_vars.get(func.id, [])[:2] if not held else []:  # for hook in self._hooks: hook(x)
                for v, w in (self.container_items(c, fn) or [])[:8]:
                    if not (isinstance(v, ast.Name) and v.id in w.params):
                        held.append(v)
                        continue
                    name = v.id  # register_hook(fn): what its callers pass
                    held += [a for _, call in self.feeding_callers(w)[:8] if (a := argument(call, w, name)) is not None]
        return [e for e in held if isinstance(e, ast.Lambda)]

    def property_reads(self, fn: FunctionInfo) -> list[tuple[FunctionInfo, ast.Attribute]]:
        """The ``@property`` getters `fn` runs by reading an attribute (``self.num_sequences``, ``info.seq_lens``)
        of an object whose class is known: a read is a call of the getter (and, on ``self``, of its overrides)."""
        cached = self._property_cache.get(id(fn))
        if cached is not None:
            return cached
        if self._property_names is None:
            self._property_names = frozenset(
                name
                for ci in self.classes.values()
                for name, m in ci.methods.items()
                if any(dotted(d) in PROPERTIES for d in m.decorators)
            )
        names = self._property_names
        called = {id(c.func) for c in fn.calls} if names else set()
        out: list[tuple[FunctionInfo, ast.Attribute]] = []
        for node in fn.attributes if names else ():
            if node.attr not in names or not isinstance(node.ctx, ast.Load) or id(node) in called:
                continue
            cls = self.instance_type(node.value, fn)
            getter = self.method(cls, node.attr) if cls is not None else None
            if cls is None and not imported_root(node.value, fn):  # meta.token_to_req: the one class defining it
                getter = self.sole_method(node.attr)  # as a cached property (a plain one's name is too common)
                if getter is not None and not any(dotted(d) in _CACHED for d in getter.decorators):
                    getter = None
            if getter is None or not any(dotted(d) in PROPERTIES for d in getter.decorators):
                continue
            out.append((getter, node))
            if isinstance(node.value, ast.Name) and node.value.id == "self" and getter.cls is not None:
                out.extend((o, node) for o in self.overrides(getter.cls, node.attr))
        self._property_cache[id(fn)] = out
        return out

    def property_writes(self, fn: FunctionInfo) -> list[tuple[FunctionInfo, ast.Attribute]]:
        """The ``@x.setter`` methods `fn` runs by storing an attribute (``self.indices_capacity = n``) of an object
        whose class is known (on ``self``, also the setters of subclasses)."""
        out: list[tuple[FunctionInfo, ast.Attribute]] = []
        names = self._setter_names
        if not names:
            return out
        for node in fn.attributes:
            if node.attr not in names or not isinstance(node.ctx, ast.Store):
                continue
            cls = self.instance_type(node.value, fn)
            found = next((c.setters[node.attr] for c in with_bases(cls) if node.attr in c.setters), None)
            if found is None:
                continue
            out.append((found, node))
            if isinstance(node.value, ast.Name) and node.value.id == "self" and cls is not None:
                out.extend((s, node) for s in self.overrides(cls, node.attr, setters=True))
        return out

    def held_callables(self, cls: ClassInfo, attr: str) -> list[FunctionInfo]:
        """The project functions attribute `attr` of an instance of `cls` holds when it is not a method: a bound
        method or a function assigned to it (``self.update = self.update_single_wrapper``, ``self.step = other.run``,
        either branch of ``a if c else b``), so that ``obj.update(...)`` calls them."""
        out: list[FunctionInfo] = []
        for c in with_bases(cls):
            for value, where in c.attr_assigns.get(attr, [])[:8]:
                if self._builds_object(value, where):
                    continue  # an object: instance_call's answer
                partial = isinstance(value, ast.Call) and value.args and dotted(value.func) in _PARTIALMETHODS
                named = value.args[0] if partial and isinstance(value, ast.Call) else None
                if isinstance(named, ast.Name) and named.id in c.methods:
                    out.append(c.methods[named.id])  # sample_random = partialmethod(_sample, ...) in c's body: c's own
                else:
                    out += self.callables(value, where, partials=True)
        return out

    def _builds_object(self, value: ast.expr, fn: FunctionInfo) -> bool:
        """``EncoderAttention()``: a value that constructs an object of a project class."""
        f = value.func if isinstance(value, ast.Call) else None
        return isinstance(f, ast.Name | ast.Attribute) and isinstance(self.resolve_def(f, fn), ClassInfo)

    def vararg_item(self, fn: FunctionInfo, i: int, depth: int = 0) -> list[tuple[ast.expr, FunctionInfo]]:
        """Item `i` of `fn`'s ``*args``: the positional argument each call of `fn` passes there (a middleware's
        ``fb = args[0]``); through a caller that forwards its own ``*args`` (``self.inner(*args, **kwargs)``), what
        that caller's callers pass."""
        node = fn.node
        if isinstance(node, ast.Module) or node.args.vararg is None or depth > 3:
            return []
        at = len(positional_names(fn)) + i
        out: list[tuple[ast.expr, FunctionInfo]] = []
        for caller, call in self.callers(fn)[:8]:
            for j, a in enumerate(call.args[: at + 1]):
                if isinstance(a, ast.Starred):  # forwarded: item at - j of the caller's own *args
                    own = caller.node.args.vararg if not isinstance(caller.node, ast.Module) else None
                    forwarded = own is not None and isinstance(a.value, ast.Name) and a.value.id == own.arg
                    out += self.vararg_item(caller, at - j, depth + 1) if forwarded else []
                    break
                if j == at:
                    out.append((a, caller))
        return out[:8]

    def passed_arguments(
        self, call: ast.Call, callee: FunctionInfo, param: str, caller: FunctionInfo
    ) -> list[tuple[ast.expr, FunctionInfo]]:
        """What `call` (in `caller`) passes for `callee`'s parameter `param`; where the call forwards the caller's own
        ``*args`` (``cls = resolve(qualname); return cls(*args, **kwargs)``), what the caller's callers pass at that
        place (``instantiate(name, self.model, cfg)`` gives ``runnable`` the model)."""
        arg = argument(call, callee, param)
        if arg is not None:
            return [(arg, caller)]
        star = next((i for i, a in enumerate(call.args) if isinstance(a, ast.Starred)), None)
        spread = call.args[star].value if star is not None else None  # type: ignore[attr-defined]
        node = caller.node
        vararg = node.args.vararg if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) else None
        if star is None or vararg is None or not isinstance(spread, ast.Name) or spread.id != vararg.arg:
            return []
        names = positional_names(callee)
        if param not in names or names.index(param) < star:
            return []
        at = len(positional_names(caller)) + names.index(param) - star  # where the caller's callers put it
        out = []
        for outer, outer_call in self.feeding_callers(caller)[:8]:
            args = outer_call.args
            if at < len(args) and not any(isinstance(a, ast.Starred) for a in args[: at + 1]):
                out.append((args[at], outer))
        return out

    def handoff_callers(
        self, fn: FunctionInfo, calls_by_name: dict[str, list[tuple[FunctionInfo, ast.Call]]]
    ) -> list[tuple[FunctionInfo, ast.Call]]:
        """Hand-offs that run `fn` (`handed_callable`): ``functools.reduce(run_stage, stages, ctx)``,
        ``list(map(partial(f, k=v), xs))``."""
        if self._handoffs is None:  # each hand-off once, by the name of the function it is handed
            self._handoffs = {}
            for name in ("reduce", "map", "filter"):
                for caller, call in calls_by_name.get(name, []):
                    handed = handed_callable(call, caller)
                    named = handed.args[0] if isinstance(handed, ast.Call) and handed.args else handed
                    if handed is not None and named is not None and (last := terminal_name(named)) is not None:
                        self._handoffs.setdefault(last, []).append((caller, call, handed))
        return [
            (caller, call)
            for caller, call, handed in self._handoffs.get(fn.name, [])[:64]
            if any(t is fn for t in self.callables(handed, caller, partials=True))
        ]

    def callables(
        self,
        value: ast.expr,
        fn: FunctionInfo,
        *,
        partials: bool = False,
        depth: int = 0,
        spent: list[int] | None = None,
    ) -> list[FunctionInfo]:
        """The project functions a callable expression names: ``self._forward_decode``, ``helper``, a ``lambda``,
        either branch of ``a if c else b`` and, with `partials`, the function of ``functools.partial(helper, ...)``
        (or ``partialmethod``), the closure a factory call returns and the ``__call__`` of an object built in place
        (whose arguments no longer line up with the call's)."""
        spent = [0] if spent is None else spent  # one budget for a question and every hop it asks in turn
        spent[0] += 1
        if depth > 6 or spent[0] > _BUDGET:  # a closure handed down constructors and calls, then returned: some hops
            return []
        if isinstance(value, ast.Lambda):  # {"decode": lambda fb: self._init_decode(fb)}
            return [f] if (f := lambda_function(value)) is not None else []
        if isinstance(value, ast.IfExp):
            return [
                *self.callables(value.body, fn, partials=partials, depth=depth + 1, spent=spent),
                *self.callables(value.orelse, fn, partials=partials, depth=depth + 1, spent=spent),
            ]
        if partials and isinstance(value, ast.Call) and value.args and dotted(value.func) in PARTIALS:
            return self.callables(value.args[0], fn, partials=partials, depth=depth + 1, spent=spent)
        if partials and isinstance(value, ast.Call) and isinstance(value.func, ast.Name | ast.Attribute):
            factory = self.resolve_def(value.func, fn)  # stage = make_stage_fn(w): the closure the factory returns
            if isinstance(factory, ClassInfo):  # hooks.append(LoraSlotHook(...)): the object's __call__
                return [m] if (m := self.method(factory, "__call__")) is not None else []
            rets = factory.returns[:4] if isinstance(factory, FunctionInfo) else []
            return [t for r in rets for t in self.callables(r, factory, partials=True, depth=depth + 1, spent=spent)]  # type: ignore[arg-type]
        if isinstance(value, ast.Name) and value.id in fn.params and value.id not in ("self", "cls"):
            # a callable handed in: CUDAGraphWrapper(self.model.forward_decode) keeps it as self.runnable
            handed = [
                t
                for caller, call in self.feeding_callers(fn)[:8]
                for arg, where in self.passed_arguments(call, fn, value.id, caller)
                for t in self.callables(arg, where, partials=partials, depth=depth + 1, spent=spent)
            ]
            default = param_default(fn, value.id)  # tokens_of=lambda b: ...: what callers that omit it run
            handed += (
                self.callables(default, fn, partials=partials, depth=depth + 1, spent=spent)
                if default is not None
                else []
            )
            if handed or fn.params[value.id] is None:
                return handed
        if isinstance(value, ast.Name) and value.id not in fn.local_assigns and value.id in fn.loop_vars:
            items = [
                e for c in fn.loop_vars[value.id][:2] for e in literal_items(c)[:8]
            ]  # for hook in (a, b, lambda m: ..)
            return [t for e in items for t in self.callables(e, fn, partials=partials, depth=depth + 1, spent=spent)]
        lookup: ast.expr | None = None
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and _is_get(value):
            lookup = value.func.value
        elif isinstance(value, ast.Subscript) and not isinstance(value.slice, ast.Slice):
            lookup = value.value
        if lookup is not None:  # handler = self._forward_table[(mode, use_graph)]: any callable the table holds
            held = self.container_items(lookup, fn) or []
            return [
                t for v, w in held[:16] for t in self.callables(v, w, partials=partials, depth=depth + 1, spent=spent)
            ]
        if isinstance(value, ast.Name) and len(local := fn.local_assigns.get(value.id, [])) == 1:
            # draft = self.forward_draft if cfg.mtp else None: what the local is bound to
            return self.callables(local[0], fn, partials=partials, depth=depth + 1, spent=spent)
        if isinstance(value, ast.Name) and value.id in _BUILTINS and not local and value.id not in fn.params:
            return [t] if isinstance(t := self.resolve_def(value, fn), FunctionInfo) else []  # len(x): no closure
        if partials and isinstance(value, ast.Name) and not local and value.id not in fn.params:
            unpacked = [  # prepare, launch = make_graph_fns(...): item i of the tuples the factory returns
                t
                for call, i in _unpacked_calls(fn, value.id)
                if isinstance(factory := self.resolve_def(call.func, fn), FunctionInfo)
                for r in factory.returns[:4]
                if isinstance(r, ast.Tuple) and i < len(r.elts)
                for t in self.callables(r.elts[i], factory, partials=True, depth=depth + 1, spent=spent)
            ]
            if unpacked:
                return unpacked
        outer = fn.parent  # a closure's free variable: sampler = make_sampler(cfg) in the enclosing function
        free = isinstance(value, ast.Name) and not local and value.id not in fn.params and outer is not None
        if free and outer is not None and isinstance(value, ast.Name) and _binds(outer, value.id):
            return self.callables(value, outer, partials=partials, depth=depth + 1, spent=spent)
        if isinstance(value, ast.Name | ast.Attribute):
            target = self.resolve_def(value, fn)
            if isinstance(target, FunctionInfo):
                return [target]
            own = owner_of(fn).cls if isinstance(value, ast.Attribute) and _is_self(value.value) else None
            if partials and target is None and isinstance(value, ast.Attribute) and own is not None:
                found: list[FunctionInfo] = []
                for c in with_bases(own):  # attend_local = functools.partialmethod(_attend_eager, "local")
                    for v, w in c.attr_assigns.get(value.attr, [])[:4]:
                        named = v.args[0] if isinstance(v, ast.Call) and v.args and dotted(v.func) in PARTIALS else None
                        body = c.methods.get(named.id) if isinstance(named, ast.Name) else None  # the class body's
                        found += (
                            [body]
                            if body is not None
                            else self.callables(v, w, partials=True, depth=depth + 1, spent=spent)
                        )
                if found:
                    return found
            return list(self.instance_call(value, fn)) if target is None else []  # an object: its __call__ (forward)
        return []


_BUILTINS = frozenset(dir(builtins))
_PARTIALMETHODS = frozenset({"functools.partialmethod", "partialmethod"})
_BUDGET = 96  # hops one callables() question may take in all (each fans out to callers and items)


def _is_get(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Attribute) and call.func.attr == "get" and bool(call.args)


def _param_scope(fn: FunctionInfo, name: str) -> FunctionInfo | None:
    """The function whose parameter `name` is, read in `fn` or a closure's enclosing function; None where a local
    binds it first or no function does."""
    scope: FunctionInfo | None = fn
    while scope is not None and name not in scope.local_assigns:
        if name in scope.params:
            return scope
        scope = scope.parent
    return None


def _binds(fn: FunctionInfo, name: str) -> bool:
    """Whether `fn` binds `name` (a local, a parameter, a tuple-unpacked call result)."""
    return name in fn.local_assigns or name in fn.params or bool(_unpacked_calls(fn, name))


def param_default(fn: FunctionInfo, name: str) -> ast.expr | None:
    """The default value of parameter `name` of `fn`, or None."""
    if isinstance(fn.node, ast.Module):
        return None
    a = fn.node.args
    pos = [*a.posonlyargs, *a.args]
    pairs = [
        *zip(pos[len(pos) - len(a.defaults) :], a.defaults, strict=False),
        *zip(a.kwonlyargs, a.kw_defaults, strict=True),
    ]
    return next((d for p, d in pairs if p.arg == name and d is not None), None)


def _unpacked_calls(fn: FunctionInfo, name: str) -> list[tuple[ast.Call, int]]:
    """``(call, i)`` where `fn` binds `name` as item i of a tuple a call returns (``prepare, launch = make(...)``)."""
    out: list[tuple[ast.Call, int]] = []
    for a in fn.assigns:
        if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call):
            for t in a.targets:
                elts = t.elts if isinstance(t, ast.Tuple | ast.List) else []
                out += [(a.value, i) for i, e in enumerate(elts) if isinstance(e, ast.Name) and e.id == name]
    return out


def handed_callable(call: ast.Call, fn: FunctionInfo) -> ast.expr | None:
    """The function a hand-off runs while the caller waits for it: ``f`` of ``functools.reduce(f, xs, init)``,
    ``map(f, xs)``, ``filter(f, xs)`` and the ``key=`` of ``sorted``/``min``/``max``; ``module.apply(f)`` (torch
    calls `f` on each submodule); of
    ``loop.run_in_executor(pool, f, ...)`` and ``asyncio.to_thread(f, ...)`` (awaited), and of ``executor.submit(f,
    ...)`` whose future the same function waits on (``.result()``). A job submitted and left to run, a thread, a
    callback scheduled on the loop run beside the step, not in it."""
    f = call.func
    if imported_name(f, fn, "functools") == "functools.reduce" and call.args:
        return call.args[0]
    named = isinstance(f, ast.Name) and f.id in ("map", "filter", "sorted", "min", "max")
    if (
        named
        and isinstance(f, ast.Name)
        and not any(f.id in d for d in (fn.module.functions, fn.module.imports, fn.local_assigns, fn.params))
    ):
        if f.id in ("map", "filter") and len(call.args) >= 2 and _consumed(call, fn):
            return call.args[0]  # lazy: only where the same function drains it (list(map(f, xs)), a for loop)
        if f.id in ("sorted", "min", "max"):
            return next((k.value for k in call.keywords if k.arg == "key"), None)
    if isinstance(f, ast.Attribute) and f.attr == "apply" and len(call.args) == 1 and not call.keywords:
        return call.args[0]  # model.apply(partial(fn, fb=fb)): torch calls fn on every submodule, in place
    ran = executed_callable(call)
    if ran is not None:  # only where it is awaited: a task made of it runs beside the step
        awaited = any(isinstance(n, ast.Await) and n.value is call for n in ast.walk(fn.node))
        return ran if awaited else None
    if terminal_name(call.func) != "submit" or not call.args:
        return None
    waited = {
        ast.unparse(c.func.value) for c in fn.calls if isinstance(c.func, ast.Attribute) and c.func.attr == "result"
    }
    held = [n for n, vs in fn.local_assigns.items() if any(v is call for v in vs)]
    return call.args[0] if ast.unparse(call) in waited or any(n in waited for n in held) else None


_DRAINS = frozenset({"list", "tuple", "set", "frozenset", "dict", "sorted", "sum", "any", "all", "max", "min"})


def _consumed(it: ast.Call, fn: FunctionInfo) -> bool:
    """Whether `fn` drains the iterator `it` it makes: the argument of ``list``/``sum``/``any``/..., or the iterable
    of a loop or comprehension of `fn`, itself or through a local bound to it alone (``counts = map(f, xs)``)."""
    held = {n for n, vs in fn.local_assigns.items() if len(vs) == 1 and vs[0] is it}  # counts = map(f, xs)

    def drained(e: ast.expr) -> bool:
        return e is it or (isinstance(e, ast.Name) and e.id in held)

    to_drain = (c.args[0] for c in fn.calls if isinstance(c.func, ast.Name) and c.func.id in _DRAINS and c.args)
    return any(map(drained, to_drain)) or any(drained(i) for iters in fn.loop_vars.values() for i in iters)


def _is_self(value: ast.expr) -> bool:
    return isinstance(value, ast.Name) and value.id == "self"


def _field_hook(d: ast.expr) -> bool:
    """``@seq_lens.validator`` (or ``.default``) on a method of an attrs class."""
    return isinstance(d, ast.Attribute) and d.attr in ("validator", "default") and isinstance(d.value, ast.Name)


def imported_root(expr: ast.expr, fn: FunctionInfo) -> bool:
    """Whether an attribute chain starts at an imported name (``torch.cuda``, ``np.random``): not a project object."""
    while isinstance(expr, ast.Attribute | ast.Subscript | ast.Call):
        expr = expr.func if isinstance(expr, ast.Call) else expr.value
    return isinstance(expr, ast.Name) and expr.id in fn.module.imports


def generates_init(ci: ClassInfo) -> bool:
    """`ci` is decorated ``@dataclass``/``@dataclasses.dataclass(...)`` or with attrs (``@attr.s``, ``@define``):
    its ``__init__`` is generated from its fields."""
    for d in ci.node.decorator_list:
        name = dotted(d.func if isinstance(d, ast.Call) else d) or ""
        off = isinstance(d, ast.Call) and any(
            k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False for k in d.keywords
        )
        if "dataclass" in name or name.startswith("attr") or name in ("define", "frozen", "mutable"):
            return not off  # @dataclass(init=False): the class writes its own
    return False


def classmethod_class(fn: FunctionInfo) -> ClassInfo | None:
    """The class of the ``@classmethod`` that `fn` is (or is nested in)."""
    top = owner_of(fn)
    node = top.node
    if top.cls is None or isinstance(node, ast.Module):
        return None
    return top.cls if any(dotted(d) == "classmethod" for d in node.decorator_list) else None
