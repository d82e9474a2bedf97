"""Which values are FlashInfer wrappers, and which callables are FlashInfer plan functions, by dataflow.

A receiver is a wrapper when some value it may hold (`ValueFlow.sources`: locals, parameters filled by callers,
attributes, list and dict items, loop variables, return values) is a wrapper constructor call, an instance of a
project subclass of one, or a parameter annotated with a wrapper class; its name does not matter (``w``,
``decode``, ``self.wrappers["decode"]``). A callable is a plan function when it flows from an imported
``fast_decode_plan``-like function, directly or through ``functools.partial``, ``types.MethodType`` or an attribute
(``self._plan_fn = fast_decode_plan``).
"""

from __future__ import annotations

import ast

from flashcheck.verifier.astutil import alias_value, annotation, dotted, is_none, kwarg, terminal_name
from flashcheck.verifier.bindings import imported_name
from flashcheck.verifier.flashinfer_api import (
    PLAN_METHODS,
    graph_mode,
    imported_elsewhere,
    is_flashinfer_import,
    is_wrapper_class_name,
    module_imports_flashinfer,
    wrapper_class_of_call,
)
from flashcheck.verifier.project import ClassInfo, FunctionInfo, ModuleInfo
from flashcheck.verifier.provenance.flow import ValueFlow, arg_for_param, is_partial, with_bases

__all__ = ["Wrappers"]


class Wrappers:
    """Wrapper identity and plan callables over one project's value flow (cached per node)."""

    def __init__(self, flow: ValueFlow) -> None:
        self.flow = flow
        self._cache: dict[ast.expr, str | None] = {}
        self._plans: dict[ast.expr, tuple[str, str, int] | None] = {}
        self._active: set[int] = set()
        self._installed: dict[int, str] | None = None
        # Without any flashinfer import there are no wrappers or plan functions to find (torch, most projects).
        self.enabled = module_imports_flashinfer(t for m in flow.project.modules.values() for t in m.imports.values())
        self._plan_values: bool | None = None

    def wrapper_class(self, expr: ast.expr, fn: FunctionInfo, depth: int = 0) -> str | None:
        """The FlashInfer wrapper class `expr` may be an instance of (``BatchDecodeWithPagedKVCacheWrapper``)."""
        key = id(expr)
        if expr in self._cache:
            return self._cache[expr]
        if not self.enabled or key in self._active or depth > 8:
            return None
        self._active.add(key)
        try:
            found = self._wrapper_class(expr, fn, depth)
        finally:
            self._active.discard(key)
        self._cache[expr] = found
        return found

    def _wrapper_class(self, expr: ast.expr, fn: FunctionInfo, depth: int) -> str | None:
        if isinstance(expr, ast.IfExp | ast.BoolOp | ast.NamedExpr):  # None if graph else Wrapper(...), w or W()
            if isinstance(expr, ast.IfExp):
                branches = [expr.body, expr.orelse]
            else:
                branches = expr.values if isinstance(expr, ast.BoolOp) else [expr.value]
            for b in branches:
                found = self.wrapper_class(b, fn, depth + 1)
                if found is not None:
                    return found
            return None
        if isinstance(expr, ast.Call):
            direct = wrapper_class_of_call(expr, fn)
            if direct is not None:
                return direct
            f = expr.func
            target = self.flow.project.resolve_def(f, fn) if isinstance(f, ast.Name | ast.Attribute) else None
            inner = self.delegated(expr, fn) if isinstance(target, ClassInfo) else None
            if inner is not None:  # a proxy that forwards every attribute to the wrapper it holds
                return self.wrapper_class(inner, fn, depth + 1)
            if isinstance(target, ClassInfo):
                return self.flashinfer_base(target)
            returns = annotation(getattr(target.node, "returns", None)) if isinstance(target, FunctionInfo) else None
            union = isinstance(returns, ast.BinOp) and not any(is_none(x) for x in (returns.left, returns.right))
            n = _annotated_class(returns) if not union else None  # -> A | B names no one class
            if n is not None and is_wrapper_class_name(n):  # def paged_prefill(cls) -> BatchPrefillWith...Wrapper:
                return n  # the factory's word, over what a shared cache it returns from may hold
        if isinstance(expr, ast.Name) and expr.id in fn.params:
            n = _annotated_class(fn.params[expr.id])
            if n is not None and is_wrapper_class_name(n):
                return n
            if fn.cls is None and next(iter(fn.params)) == expr.id:
                installed = self.installed_on(fn)
                if installed is not None:  # Wrapper.plan = shim: its first parameter is the wrapper
                    return installed
        if isinstance(expr, ast.Attribute):  # a field or attribute annotated with a wrapper class
            owner_cls = self.flow.instance_type(expr.value, fn)
            for c in with_bases(owner_cls):
                n = _annotated_class(c.attr_types.get(expr.attr))
                if n is not None and is_wrapper_class_name(n):
                    return n
        for src, where in self.flow.sources(expr, fn):
            found = self.wrapper_class(src, where, depth + 1)
            if found is not None:
                return found
        return None

    def built_elsewhere(self, expr: ast.expr, fn: FunctionInfo) -> bool:
        """Every value `expr` may hold is built by a class imported from outside FlashInfer and the project under a
        name that is not a FlashInfer wrapper's (the ``BatchPrefillWithSparseAttention`` of an engine's own kernel
        package): whatever it is named, its ``plan()`` is not FlashInfer's. A factory function, or a FlashInfer
        class re-exported by another package, may still build a FlashInfer wrapper."""
        found = self.flow.sources(expr, fn)[:8]
        return bool(found) and all(self._foreign_class(v, where) for v, where in found)

    def _foreign_class(self, value: ast.expr, fn: FunctionInfo) -> bool:
        name = terminal_name(value.func) if isinstance(value, ast.Call) else None
        if name is not None and isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            name = fn.module.imports.get(name, name).rsplit(".", 1)[-1]  # `import ...Wrapper as DecodeW`: its own name
        return (
            isinstance(value, ast.Call)
            and name is not None
            and name[:1].isupper()
            and not is_wrapper_class_name(name)
            and imported_elsewhere(value.func, fn, self.flow.project)
        )

    def constructions(self, expr: ast.expr, fn: FunctionInfo) -> list[tuple[ast.Call, FunctionInfo, str]]:
        """Every FlashInfer wrapper constructor call `expr` may be (through the value flow: factories, parameters,
        items, attributes of other objects, both branches of conditional expressions), with its class name; empty
        when none is known."""
        if not self.enabled:
            return []
        out: list[tuple[ast.Call, FunctionInfo, str]] = []
        seen: set[int] = set()
        stack: list[tuple[ast.expr, FunctionInfo, int]] = [(expr, fn, 0)]
        while stack and len(seen) < 256:
            e, where, depth = stack.pop()
            if id(e) in seen or depth > 8:
                continue
            seen.add(id(e))
            if isinstance(e, ast.IfExp):
                stack.extend([(e.body, where, depth + 1), (e.orelse, where, depth + 1)])
                continue
            if isinstance(e, ast.BoolOp):
                stack.extend((v, where, depth + 1) for v in e.values)
                continue
            if isinstance(e, ast.Call):
                cls = wrapper_class_of_call(e, where) or self._module_alias(e.func, where)
                if cls is None:
                    target = (
                        self.flow.project.resolve_def(e.func, where)
                        if isinstance(e.func, ast.Name | ast.Attribute)
                        else None
                    )
                    cls = self.flashinfer_base(target) if isinstance(target, ClassInfo) else None
                if cls is not None:
                    out.append((e, where, cls))
                    continue
                inner = self.delegated(e, where)  # TracedWrapper(BatchDecode...(...)): the wrapper it forwards to
                if inner is not None:
                    stack.append((inner, where, depth + 1))
                    continue
            stack.extend((v, w, depth + 1) for v, w in self.flow.sources(e, where))
            stack.extend((v, w, depth + 1) for v, w in self._foreign_items(e, where))
        return out

    def graph_mode(self, call: ast.Call, cls_name: str, fn: FunctionInfo, *, positions: bool = True) -> bool | None:
        """`flashinfer_api.graph_mode`, reading a ``**kwargs`` dict the call spreads where the call does not say
        (``**wrapper_kwargs("decode", use_cuda_graph=True)``): True or False where every value found agrees (a dict
        that holds no ``use_cuda_graph`` leaves the default, False), None where they differ."""
        mode = graph_mode(call, cls_name, positions=positions)
        spreads = [kw.value for kw in call.keywords if kw.arg is None]
        if mode is not None or not spreads or kwarg(call, "use_cuda_graph") is not None:
            return mode
        starts = [s for spread in spreads for s in self.flow.spread_values(spread, "use_cuda_graph", fn)]
        values = set(self.flow.constants(starts, limit=32)) if starts else {False}
        return True if values == {True} else False if values == {False} else None

    def delegated(self, call: ast.Call, fn: FunctionInfo) -> ast.expr | None:
        """The argument a proxy's constructor call hands the object its ``__getattr__`` forwards every attribute to
        (``TracedWrapper(inner, name)`` with ``self._inner = inner`` and ``getattr(self._inner, attr)``), or None."""
        project = self.flow.project
        cls = project.resolve_def(call.func, fn) if isinstance(call.func, ast.Name | ast.Attribute) else None
        getter = project.method(cls, "__getattr__") if isinstance(cls, ClassInfo) else None
        init = project.method(cls, "__init__") if isinstance(cls, ClassInfo) else None
        own = isinstance(cls, ClassInfo) and any(project.method(cls, m) for m in ("plan", "run"))
        if getter is None or init is None or init.cls is None or own:
            return None  # a class with its own plan()/run() is no mere proxy: what they do is its own
        held = [
            c.args[0].attr
            for c in getter.calls
            if dotted(c.func) == "getattr"
            and c.args
            and isinstance(c.args[0], ast.Attribute)
            and dotted(c.args[0].value) == "self"
        ]
        for value, where in init.cls.attr_assigns.get(held[0], []) if held else []:
            if where is init and isinstance(value, ast.Name) and value.id in init.params:
                return arg_for_param(call, init, value.id)
        return None

    def _foreign_items(self, e: ast.expr, fn: FunctionInfo) -> list[tuple[ast.expr, FunctionInfo]]:
        """For ``self.graphs[bs]`` (also ``self.graphs.get(bs)``): wrappers other objects store into that dict
        (``self.backend.graphs[bs] = w`` in a graph runner), by the receiver's class. Read for wrapper identity only:
        device provenance keeps to the owner's own stores (a dict like ``node.meta`` is written from everywhere)."""
        if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == "get" and e.args:
            e = ast.Subscript(value=e.func.value, slice=e.args[0], ctx=ast.Load())  # self.graphs.get(bs)
        if not isinstance(e, ast.Subscript) or not isinstance(e.value, ast.Attribute):
            return []
        owner_cls = self.flow.project.instance_type(e.value.value, fn)
        if owner_cls is None:
            return []
        stores = self.flow.calls.foreign_item_stores(e.value.attr)
        return [(v, w) for r, v, w in stores if owner_cls in with_bases(self.flow.project.instance_type(r, w))]

    def installed_on(self, fn: FunctionInfo) -> str | None:
        """The FlashInfer wrapper class a free function is assigned onto as a method (``Wrapper.plan = fn``)."""
        if self._installed is None:
            self._installed = {}
            project = self.flow.project
            for f in project.all_functions():
                for a in f.assigns:
                    if not isinstance(a, ast.Assign) or not isinstance(a.value, ast.Name | ast.Attribute):
                        continue
                    for t in a.targets:
                        cls = self._class_named(t.value, f) if isinstance(t, ast.Attribute) else None
                        target = project.resolve_def(a.value, f) if cls is not None else None
                        if cls is not None and isinstance(target, FunctionInfo):
                            self._installed[id(target)] = cls
        return self._installed.get(id(fn))

    def _class_named(self, expr: ast.expr, fn: FunctionInfo) -> str | None:
        """The FlashInfer wrapper class `expr` names: an imported one, or a project subclass of one."""
        d = dotted(expr)
        if d is None:
            return None
        last = d.rsplit(".", 1)[-1]
        if is_wrapper_class_name(last) and (is_flashinfer_import(fn, d) or d.startswith("flashinfer.")):
            return last
        target = self.flow.project.resolve_def(expr, fn)
        return self.flashinfer_base(target) if isinstance(target, ClassInfo) else None

    def constructed(self, call: ast.Call, fn: FunctionInfo) -> tuple[str, bool] | None:
        """The FlashInfer wrapper class a call builds: a FlashInfer constructor, or a project subclass of one
        (``Fp8DecodeWrapper(ws, "HND", use_cuda_graph=True, ...)``), with whether its arguments sit where
        FlashInfer's constructor has them (False when a project class on the way defines its own ``__init__``:
        then only keywords are known)."""
        direct = wrapper_class_of_call(call, fn)
        if direct is not None:
            return direct, True
        f = call.func
        if not self.enabled or not isinstance(f, ast.Name | ast.Attribute):
            return None
        aliased = self._module_alias(f, fn)  # fi_plan.DecodeWrapper(...) with DecodeWrapper = flashinfer.X there
        if aliased is not None:
            return aliased, True
        target = self.flow.project.resolve_def(f, fn)
        base = self.flashinfer_base(target) if isinstance(target, ClassInfo) else None
        if base is None or not isinstance(target, ClassInfo):
            return None
        own_init = any("__init__" in c.methods for c in with_bases(target) if self.flashinfer_base(c) is not None)
        return base, not own_init

    def _module_alias(self, f: ast.expr, fn: FunctionInfo) -> str | None:
        """The FlashInfer wrapper class ``module.Name`` aliases, where `module` is a project module whose top level
        (or a module it re-exports the name from) binds ``Name = flashinfer.X`` (`alias_value`)."""
        if not isinstance(f, ast.Attribute) or not isinstance(f.value, ast.Name | ast.Attribute):
            return None
        project = self.flow.project
        mod = project.resolve_def(f.value, fn)
        found = project.binding(mod, f.attr) if isinstance(mod, ModuleInfo) else None
        if found is None or found[0].body is None:
            return None
        value = alias_value([v for v, _ in found[0].global_values(found[1])])
        full = imported_name(value, found[0].body, "flashinfer") if value is not None else None
        last = full.rsplit(".", 1)[-1] if full is not None else ""
        return last if full is not None and full.startswith("flashinfer.") and is_wrapper_class_name(last) else None

    def subclass_names(self) -> set[str]:
        """Names of the project classes that derive from a FlashInfer wrapper (calls of them build wrappers)."""
        if not self.enabled:
            return set()
        return {ci.name for ci in self.flow.project.classes.values() if self.flashinfer_base(ci) is not None}

    def flashinfer_base(self, cls: ClassInfo, depth: int = 0) -> str | None:
        """The FlashInfer wrapper class a project class derives from (directly, through project classes or
        through a module-level alias such as ``Base = flashinfer.BatchDecodeWithPagedKVCacheWrapper``)."""
        body = cls.module.body
        for b in cls.node.bases:
            d = dotted(b)
            if d is None or body is None:
                continue
            aliases = body.local_assigns.get(d, [])
            if len(aliases) == 1 and dotted(aliases[0]) is not None:
                d = dotted(aliases[0]) or d
            last = d.rsplit(".", 1)[-1]
            if (
                is_flashinfer_import(body, d)
                or d.startswith("flashinfer.")
                or (is_wrapper_class_name(last) and last not in cls.module.classes)
            ):
                return last
        for base in cls.bases if depth < 8 else []:
            found = self.flashinfer_base(base, depth + 1)
            if found is not None:
                return found
        return None

    def plan_function(self, func: ast.expr, fn: FunctionInfo) -> str | None:
        """The FlashInfer plan function (``fast_decode_plan``) a callable expression may be."""
        found = self.callable_target(func, fn)
        return found[1] if found is not None and found[0] == "function" else None

    def bound_plan(self, func: ast.expr, fn: FunctionInfo) -> tuple[str, int] | None:
        """(wrapper class, arguments already bound) when a callable is a wrapper's bound ``plan`` method reached
        through an alias: ``p = w.plan``, ``self._plan = self._wrapper.plan``, ``functools.partial(w.plan, ...)``."""
        found = self.callable_target(func, fn)
        return (found[1], found[2]) if found is not None and found[0] == "method" else None

    def bound_args(self, func: ast.expr, fn: FunctionInfo) -> int:
        """How many leading positional arguments the partials between `func` and its target already bind."""
        found = self.callable_target(func, fn)
        return found[2] if found is not None else 0

    def callable_target(self, func: ast.expr, fn: FunctionInfo, depth: int = 0) -> tuple[str, str, int] | None:
        """What a callable expression may be, through aliases (locals, attributes, parameters, items, returns) and
        ``functools.partial``/``types.MethodType``: ``("function", "fast_decode_plan", bound)`` for a plan function,
        ``("method", wrapper class, bound)`` for a wrapper's ``plan``; `bound` counts the positional arguments the
        partials bind. None when it is neither."""
        if not self.enabled or depth > 6:
            return None
        if func in self._plans:
            return self._plans[func]
        self._plans[func] = None  # recursion guard
        self._plans[func] = found = self._callable_target(func, fn, depth)
        return found

    def _callable_target(self, func: ast.expr, fn: FunctionInfo, depth: int) -> tuple[str, str, int] | None:
        d = dotted(func)
        if d is not None:
            last = d.rsplit(".", 1)[-1]
            if last in PLAN_METHODS and last.startswith("fast_") and (is_flashinfer_import(fn, d) or depth > 0):
                return ("function", last, 0)
        if isinstance(func, ast.Call) and func.args and is_partial(func.func, fn):
            inner = self.callable_target(func.args[0], fn, depth + 1)
            if inner is None or any(isinstance(a, ast.Starred) for a in func.args):
                return inner
            return (inner[0], inner[1], inner[2] + len(func.args) - 1)
        if isinstance(func, ast.Attribute) and func.attr in PLAN_METHODS:
            cls = self.wrapper_class(func.value, fn)  # w.plan: the wrapper's method
            return ("method", cls, 0) if cls is not None else None
        if isinstance(func, ast.Call) and dotted(func.func) == "getattr" and len(func.args) >= 2:
            name = func.args[1]  # getattr(w, "plan"): the same bound method
            if isinstance(name, ast.Constant) and name.value in PLAN_METHODS:
                cls = self.wrapper_class(func.args[0], fn)
                return ("method", cls, 0) if cls is not None else None
        if isinstance(func, ast.Name | ast.Attribute | ast.Subscript) and self.plans_as_values():
            # also self._plans[bs]: what the dict holds
            for src, where in self.flow.sources(func, fn):
                found = self.callable_target(src, where, depth + 1)
                if found is not None:
                    return found
        return None

    def plans_as_values(self) -> bool:
        """Whether any code of the project handles a plan callable as a value: a load of ``w.plan``,
        ``w.begin_forward`` or ``fast_decode_plan`` (also under an import alias, in a default, a loop, a
        comprehension or a literal) that is not the function of a call, or ``getattr(w, "plan")``. Without one, no
        alias, item, parameter or return can hold a plan, and a call is a plan only as written (found once per
        project, from the trees of the modules whose text names a plan)."""
        if self._plan_values is None:
            self._plan_values = any(_handles_plans(m) for m in self.flow.project.modules.values())
        return self._plan_values


def _handles_plans(module: ModuleInfo) -> bool:
    """Whether `module` uses a plan method or function as a value (`Wrappers.plans_as_values`)."""
    tree = module.source.tree
    if tree is None or not any("plan" in line or "begin_forward" in line for line in module.source.lines):
        return False
    # FlashInfer's plan functions by the names this module binds them to (a bare ``plan`` is some local)
    functions = {m for m in PLAN_METHODS if m.startswith("fast_")}
    names = functions | {k for k, t in module.imports.items() if t.rsplit(".", 1)[-1] in functions}
    nodes = list(ast.walk(tree))
    called = {id(n.func) for n in nodes if isinstance(n, ast.Call)}
    for n in nodes:
        if isinstance(n, ast.Call):  # getattr(w, "plan")
            key = n.args[1] if dotted(n.func) == "getattr" and len(n.args) > 1 else None
            if isinstance(key, ast.Constant) and key.value in PLAN_METHODS:
                return True
        elif id(n) not in called and isinstance(getattr(n, "ctx", None), ast.Load) and _names_plan(n, names):
            return True
    return False


def _annotated_class(ann: ast.expr | None) -> str | None:
    """The class an annotation names: ``W``, ``flashinfer.W``, ``Optional[W]``, ``W | None``, ``"W"``."""
    ann = annotation(ann)
    if ann is None:
        return None
    if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
        return _annotated_class(ann.left) or _annotated_class(ann.right)
    return terminal_name(ann) if isinstance(ann, ast.Name | ast.Attribute) else None


def _names_plan(node: ast.AST, names: set[str]) -> bool:
    return (isinstance(node, ast.Name) and node.id in names) or (
        isinstance(node, ast.Attribute) and node.attr in PLAN_METHODS
    )
