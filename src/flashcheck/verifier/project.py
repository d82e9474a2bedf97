"""The project index with name resolution and a call graph between its functions.

Calls are resolved on demand, intra-project only: plain names, nested and imported functions, ``self.method()``
(including overrides in subclasses), ``super().method()``, attributes whose type is known (`flashcheck.verifier
.instances`: ``self.x = Class(...)``, an annotation, a dataclass field or the arguments callers pass), module aliases
(also across namespace packages), simple local aliases, and callables an attribute holds (``self.update =
self.update_single_wrapper``: ``obj.update()`` calls it). `Project.property_reads` lists the ``@property`` getters a
function runs by reading attributes, which hot-path reachability follows as calls.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from flashcheck.verifier.astutil import branches, class_base, dotted, literal_items, spread_local_tuples, terminal_name
from flashcheck.verifier.autograd import is_autograd_function
from flashcheck.verifier.descriptors import descriptor_calls
from flashcheck.verifier.dispatch import closed, link_protocols, resolution_order
from flashcheck.verifier.index import (
    POST_INITS,
    ClassInfo,
    FunctionInfo,
    ModuleIndex,
    ModuleInfo,
    descendants,
    owner_of,
    with_bases,
)
from flashcheck.verifier.instances import (
    PROPERTIES,
    imported_name,
    torch_module,
    torch_name,
)
from flashcheck.verifier.members import PARTIALS, Members, classmethod_class, handed_callable, imported_root
from flashcheck.verifier.reaching import Reaching
from flashcheck.verifier.registered import module_hooks, registered_callables
from flashcheck.verifier.registries import registry_call_key
from flashcheck.verifier.sequences import unstable_names
from flashcheck.verifier.source import SourceFile
from flashcheck.verifier.subclassing import link_class_keywords, method_aliases

__all__ = [
    "PARTIALS",
    "PROPERTIES",
    "ClassInfo",
    "FunctionInfo",
    "ModuleInfo",
    "Project",
    "imported_name",
    "torch_name",
]


class Project(Members):
    """Index of the parsed files; resolves names and calls between them."""

    def __init__(self, sources: list[SourceFile], indexed: list[ModuleIndex | None] | None = None) -> None:
        super().__init__(sources, indexed)
        self._callers_active: set[int] = set()
        self.generic_subclasses: dict[int, list[ClassInfo]] = {}  # classes deriving from Base[T], by id(Base)
        self._protocols: set[int] = set()  # id() of the project's typing.Protocol classes
        self.cuts = 0
        self.reaching = Reaching()  # which assignments of a local reach a read of it (flow and typing share it)
        self._held: dict[str, set[str]] | None = None
        self._value_names: tuple[frozenset[str], frozenset[str], frozenset[str]] | None = None
        self._c3_orders: dict[int, list[ClassInfo] | None] = {}  # method's, by id(class)
        self._attribute_reads: frozenset[tuple[str | None, str]] | None = None
        self._property_names: frozenset[str] | None = None
        self._methods_by_name: dict[str, list[FunctionInfo]] | None = None
        self._lambda_callers: dict[int, list[tuple[FunctionInfo, ast.Call]]] | None = None
        self._handoffs: dict[str, list[tuple[FunctionInfo, ast.Call, ast.expr]]] | None = None  # members.py
        self._setter_names = frozenset(name for ci in self.classes.values() for name in ci.setters)
        self._loop_names: dict[str, set[str]] | None = None
        self._property_cache: dict[int, list[tuple[FunctionInfo, ast.Attribute]]] = {}
        self._return_types: dict[tuple[str, int], ClassInfo | None] = {}  # returns.py
        self._instance_memo: dict[tuple[ast.expr, int, int], ClassInfo | None] = {}
        self._params_active: set[tuple[str, int]] = set()  # param_classes' recursion guard
        self._class_values: dict[tuple[ast.expr, int, int], list[ClassInfo]] = {}  # dynamic_imports.py
        self._spelling_fields: set[int] = set()
        self._grown_memo: dict[str, list[ClassInfo]] | None = None  # sequences.grown
        self._targets_memo: dict[ast.Call, list[FunctionInfo]] = {}  # _call_targets'
        self._private_strings: frozenset[str] | None = None
        self._bindings: dict[tuple[int, str], tuple[ModuleInfo, str] | None] = {}  # bindings.py
        self._star_modules: dict[int, list[ModuleInfo]] = {}
        self._module_items: dict[tuple[str, str], list[tuple[ast.expr, FunctionInfo]]] | None = None  # bindings.py
        self._module_keyed: dict[tuple[str, str, str], list[tuple[ast.expr, FunctionInfo]]] = {}
        self._subclass_memo: dict[int, list[ClassInfo]] = {}
        self._override_memo: dict[tuple[int, str, bool], tuple[FunctionInfo, ...]] = {}
        self._method_aliases: dict[int, dict[str, FunctionInfo]] = {}  # subclassing.method_aliases, once linked
        self.dispatched_lists: dict[int, set[str]] = {}  # registered.py: the callback lists a method runs, by id
        self.module_hook_index: list[tuple[ClassInfo, ast.expr, FunctionInfo]] | None = None  # registered.py
        self.descriptor_index: dict[str, list[tuple[ClassInfo, ClassInfo]]] | None = None  # descriptors.py
        self.changed_tables: frozenset[str] | None = None  # tables.py: dict attributes updated in place
        self._link_classes()
        link_class_keywords(self.classes.values(), self.method)  # class Trtllm(Backend, decode_backend="trtllm-gen")
        self.link_class_aliases()
        for f in self.all_functions():  # Step(cfg, *bufs) with bufs = (a, b): the arguments in place
            spread = [c for c in f.calls if any(isinstance(a, ast.Starred) for a in c.args)]
            unstable = unstable_names(f) if spread else set()
            for call in spread:
                spread_local_tuples(call, f.local_assigns, unstable)
        self._subclass_memo.clear()  # the class links are complete only now
        self._override_memo.clear()
        self._method_aliases = method_aliases(self.classes.values(), self.resolve_def)  # class-body ``f = A.f``
        self._override_memo.clear()  # overrides resolve through the aliases
        self.forget_answers()  # what resolving the aliases asked was asked before they were known

    def forget_answers(self) -> None:
        """Drop the call graph's memos (callers and callees found so far), so that the questions asked next are
        answered as in a model fresh from the files: an answer found while another question was under way may be
        cut short by the recursion guards, so what was asked before may matter. The name index stays: it depends
        on the files alone."""
        self._callee_cache.clear()
        self._targets_memo.clear()
        self._property_cache.clear()
        self._return_types.clear()
        self._instance_memo.clear()
        self._class_values.clear()
        self._callers.clear()
        self._callers_active.clear()

    def _link_classes(self) -> None:
        """Each class's project bases and subclasses. A generic base (``MetadataBuilder[FlashInferMetadata]``) gives
        the class its methods, but the class is not listed among that base's subclasses: a call on an object known
        only as the generic base is not expanded to every override below it (frameworks put dozens of host-side
        implementations under one generic base, such as multimodal processors reached from a warm-up run)."""
        for ci in self.classes.values():
            for b in ci.node.bases:
                target = self.resolve_def(class_base(b), ci.module.body)  # Builder[Meta]: a generic base
                if isinstance(target, ClassInfo) and target is not ci:
                    ci.bases.append(target)
                    if not isinstance(b, ast.Subscript):
                        target.subclasses.append(ci)
                    else:  # kept apart: dispatch does not expand to them, the places of attributes do
                        self.generic_subclasses.setdefault(id(target), []).append(ci)
        self._protocols = link_protocols(self.classes.values())

    def is_protocol_class(self, ci: ClassInfo) -> bool:
        """Whether `ci` is a ``typing.Protocol`` of the project (found once, when the classes are linked)."""
        return id(ci) in self._protocols

    # ------------------------------------------------------------------ name resolution
    def lookup(self, qualname: str, depth: int = 0) -> FunctionInfo | ClassInfo | ModuleInfo | None:
        """A definition by dotted name, following re-exports (``from .impl import f`` in a package)."""
        if depth > 8:
            return None
        if qualname in self.modules:
            return self.modules[qualname]
        if "." in qualname:
            by_suffix = self._suffix_module(qualname)
            if by_suffix is not None:
                return by_suffix
            under_folders = self._module_under_folders(qualname)
            if under_folders is not None:
                return under_folders
        if qualname in self.classes:
            return self.classes[qualname]
        if qualname in self._by_qualname:
            return self._by_qualname[qualname]
        head, _, last = qualname.rpartition(".")
        if not head:
            return None
        parent = self.lookup(head, depth + 1)
        return self._member(parent, last, depth + 1) if parent is not None else None

    def _member(
        self, d: FunctionInfo | ClassInfo | ModuleInfo, name: str, depth: int = 0
    ) -> FunctionInfo | ClassInfo | ModuleInfo | None:
        if isinstance(d, ModuleInfo):
            if name in d.functions:
                return d.functions[name]
            if name in d.classes:
                return d.classes[name]
            target = d.imports.get(name)
            if target:
                return self.lookup(target, depth + 1)
            return self.modules.get(f"{d.name}.{name}") or self.module_member(d, name, depth + 1)
        if isinstance(d, ClassInfo):
            return self.method(d, name)
        return None

    def method(self, ci: ClassInfo, name: str) -> FunctionInfo | None:
        """`name` as Python resolves it on an instance of `ci`: the first class of its C3 order over the project-visible
        bases that defines it (``class Plain(Paged, LateMixin)`` takes ``Paged``'s base's method before the mixin's);
        breadth-first over the bases where no order exists."""
        order = resolution_order(ci, self._c3_orders)  # the model's classes do not change: one order per class
        aliases = self._method_aliases
        for c in order:
            if name in c.methods:
                return c.methods[name]
            alias = aliases.get(id(c)) if aliases else None
            if alias is not None and name in alias:  # forward_extend = FlashInferBackend.forward_extend
                return alias[name]
        return None

    def resolve_def(
        self, expr: ast.expr, fn: FunctionInfo | None, depth: int = 0
    ) -> FunctionInfo | ClassInfo | ModuleInfo | None:
        """What a Name/Attribute expression refers to (a function, class or module of the project)."""
        if fn is None or depth > 9:
            return None
        if isinstance(expr, ast.Name):
            scope: FunctionInfo | None = fn
            while scope is not None:
                if expr.id in scope.local_defs:
                    return scope.local_defs[expr.id]
                scope = scope.parent
            mod = fn.module
            if expr.id in mod.functions:
                return mod.functions[expr.id]
            if expr.id in mod.classes:
                return mod.classes[expr.id]
            if expr.id in mod.imports:
                return self.lookup(mod.imports[expr.id])
            values = fn.local_assigns.get(expr.id) or []
            alias = values[0] if len(values) == 1 else None
            if isinstance(alias, ast.Attribute) or (isinstance(alias, ast.Name) and alias.id != expr.id):
                return self.resolve_def(alias, fn, depth + 1)  # alias: f = self.helper; f()
            return None
        if isinstance(expr, ast.Attribute):
            base = expr.value
            if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super":
                owner = owner_of(fn).cls
                for b in owner.bases if owner is not None else []:
                    m = self.method(b, expr.attr)
                    if m is not None:
                        return m
                return None
            inst = self.instance_type(base, fn, depth + 1)
            if inst is not None:
                return self.method(inst, expr.attr)
            return self._untyped_member(expr, fn, depth)
        return None

    def _untyped_member(
        self, expr: ast.Attribute, fn: FunctionInfo, depth: int
    ) -> FunctionInfo | ClassInfo | ModuleInfo | None:
        """``mod.f``, ``Class.method``, ``imported_mod.f``: an attribute of a receiver that is no known instance."""
        base = expr.value
        target = self.resolve_def(base, fn, depth + 1)
        if isinstance(target, (ModuleInfo, ClassInfo)):
            return self._member(target, expr.attr)
        if target is None and isinstance(base, ast.Name) and base.id in fn.module.imports:
            return self.lookup(f"{fn.module.imports[base.id]}.{expr.attr}")
        return None

    # ------------------------------------------------------------------ call graph
    def feeding_callers(self, fn: FunctionInfo) -> list[tuple[FunctionInfo, ast.Call]]:
        """`callers`, without tests and benchmarks when `fn` is serving code: what a test hands in says nothing of
        what the engine does."""
        found = self.callers(fn)
        return found if fn.source.is_tooling else [(c, call) for c, call in found if not c.source.is_tooling]

    def callers(self, fn: FunctionInfo) -> list[tuple[FunctionInfo, ast.Call]]:
        """Project call sites that may call `fn` (constructor calls for ``__init__``), at most 64."""
        cached = self._callers.get(id(fn))
        if cached is not None:
            return cached
        if id(fn) in self._callers_active or len(self._callers_active) > 3:
            self.cuts += 1  # answers that depend on this one are not memoised
            return []  # resolving a call inside a callers() question: do not recurse (not cached)
        self._callers_active.add(id(fn))
        try:
            return self._callers_uncached(fn)
        finally:
            self._callers_active.discard(id(fn))

    def calls_by_name(self) -> dict[str, list[tuple[FunctionInfo, ast.Call]]]:
        """Every call made through a name or an attribute (``f(...)``, ``x.f(...)``), by that name, in the order of
        `all_functions` and of each function's calls."""
        if self._calls_by_name is None:
            self._calls_by_name = {}
            for caller in self.all_functions():
                for call in caller.calls:
                    f = call.func
                    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                    name = name or registry_call_key(f)  # BACKENDS[name](cfg) under BACKENDS[]
                    if name is not None:
                        self._calls_by_name.setdefault(name, []).append((caller, call))
        return self._calls_by_name

    def used_as_value(self, fn: FunctionInfo) -> bool:
        """Whether `fn` may run through calls no call graph sees: its name read as an attribute but not called
        (``{"eager": self._prepare}``), or as a bare name handed on, assigned, returned or kept in a literal
        (``self._capture_with(run)``; for a method only where no function outside a class has that name)."""
        if self._value_names is None:
            attrs, names = set[str](), set[str]()
            for f in self.all_functions():
                called = {id(c.func) for c in f.calls}
                attrs.update(a.attr for a in f.attributes if id(a) not in called)
                for v in _handed_values(f):
                    names.update(e.id for e in (v, *literal_items(v)) if isinstance(e, ast.Name))
            free = {f.name for f in self.functions if f.cls is None}
            self._value_names = (frozenset(attrs), frozenset(names), frozenset(free))
        attrs_used, names_used, free_names = self._value_names
        return fn.name in attrs_used or (fn.name in names_used and (fn.cls is None or fn.name not in free_names))

    def private_strings(self) -> frozenset[str]:
        """Every string constant of the project that starts with an underscore: the names a ``getattr``/``setattr``
        whose name argument is not a literal may use (the value flow finds names among constants only)."""
        if self._private_strings is None:
            self._private_strings = frozenset(s for m in self.modules.values() for s in m.private_strings)
        return self._private_strings

    def attribute_reads(self) -> frozenset[tuple[str | None, str]]:
        """(the receiver's last name, the attribute) of every attribute read in serving code (``attn_inputs.
        prefix_lengths_device`` gives ``("attn_inputs", "prefix_lengths_device")``)."""
        if self._attribute_reads is None:
            self._attribute_reads = frozenset(
                (terminal_name(a.value), a.attr)
                for f in self.all_functions()
                if not f.source.is_tooling
                for a in f.attributes
            )
        return self._attribute_reads

    def _held_names(self) -> dict[str, set[str]]:
        """Attribute names that may hold a function, by the function's name (``update`` for ``update_single_wrapper``
        after ``self.update = self.update_single_wrapper``): calls through them may call it."""
        if self._held is None:
            self._held = {}
            for ci in self.classes.values():
                for attr, values in ci.attr_assigns.items():
                    for value, _ in values:
                        for v in [value.body, value.orelse] if isinstance(value, ast.IfExp) else [value]:
                            name = v.id if isinstance(v, ast.Name) else v.attr if isinstance(v, ast.Attribute) else attr
                            if name != attr:
                                self._held.setdefault(name, set()).add(attr)
        return self._held

    def _callers_uncached(self, fn: FunctionInfo) -> list[tuple[FunctionInfo, ast.Call]]:
        if fn.name == "<lambda>":
            found = self._callers[id(fn)] = self.lambda_callers().get(id(fn), [])[:64]
            return found
        calls_by_name = self.calls_by_name()
        names = [fn.name, *sorted(self._held_names().get(fn.name, ()))]
        if fn.name in _BUILDS and fn.cls is not None:  # a constructor (or what a generated one calls)
            held = sorted(self.registry_names().get(fn.cls.name, ()))  # cls = BACKENDS[name]; cls(cfg)
            names = [fn.cls.name, *(c.name for c in fn.cls.subclasses), *held, "cls"]  # cls(...) in a classmethod
        elif fn.cls is not None and (fn.name == "__call__" or (fn.name == "forward" and torch_module(fn.cls))):
            names += sorted(self._instance_names(fn.cls))  # self.attn(q, k, v), layer(h, fb): runs forward
        elif fn.cls is not None and fn.name == "forward" and is_autograd_function(fn.cls):
            names.append("apply")  # Fn.apply(q, k) runs Fn.forward
        out: list[tuple[FunctionInfo, ast.Call]] = []
        if fn.name == "__init__" and fn.cls is not None:  # super().__init__(...) in a direct subclass's constructor
            for sub in fn.cls.subclasses:
                init = sub.methods.get("__init__")
                out += [(init, c) for c in init.calls if _super_init(c.func)] if init is not None else []
        family = {id(c) for c in [fn.cls, *descendants(fn.cls)]} if fn.cls is not None else set()
        for name in names:
            for caller, call in calls_by_name.get(name, [])[:256]:
                made = classmethod_class(caller) if name == "cls" else None
                if made is not None and id(made) not in family:
                    continue  # cls(...) in a classmethod of another class builds that one
                if any(t is fn for t in self._call_targets(call, caller)):
                    out.append((caller, call))
        out += self.handoff_callers(fn, calls_by_name)
        self._callers[id(fn)] = out[:64]
        return out[:64]

    def _instance_names(self, cls: ClassInfo) -> set[str]:
        """Names that may hold an instance of `cls` or a subclass, so that calling them runs its ``__call__`` or
        ``forward``: the attributes its constructor calls are assigned to (``self.attn = Attention(...)``, also
        inside ``nn.ModuleList(...)``, lists and comprehensions; not locals of the building function, whose calls
        of every common local name would cost more than they find) and the loop variables over those (``for layer
        in self.layers``)."""
        sites = self.calls_by_name()
        out: set[str] = set()
        for c in [cls, *self.subclasses_of(cls)]:
            for f, call in sites.get(c.name, [])[:64]:
                for a in f.assigns:
                    value = a.value
                    if value is None or not (a.lineno <= call.lineno <= (a.end_lineno or a.lineno)):
                        continue  # (the line test first: walking every assignment of a large builder costs)
                    if not any(n is call for n in ast.walk(value)):
                        continue
                    for t in a.targets if isinstance(a, ast.Assign) else [a.target]:
                        name = terminal_name(t) if isinstance(t, ast.Attribute | ast.Subscript) else None
                        if name:  # self.attn = Attention(...), self.layers[i] = ...: what lasts beyond the builder
                            out.add(name)
        if self._loop_names is None:
            self._loop_names = {}
            for f in self.all_functions():
                for var, containers in f.loop_vars.items():
                    for it in containers:  # for layer, kv in zip(self.layers, caches): each zipped container
                        zipped = isinstance(it, ast.Call) and dotted(it.func) in ("zip", "enumerate")
                        for each in it.args if zipped and isinstance(it, ast.Call) else [it]:
                            held = terminal_name(each)
                            if held:
                                self._loop_names.setdefault(held, set()).add(var)
        for name in list(out):
            out |= self._loop_names.get(name, set())
        return out

    def subclasses_of(self, ci: ClassInfo) -> list[ClassInfo]:
        """Every subclass of `ci`, at any depth (memoised: the class links do not change once the model is built)."""
        found = self._subclass_memo.get(id(ci))
        if found is None:
            found = self._subclass_memo[id(ci)] = self._subclasses_uncached(ci)
        return found

    def _subclasses_uncached(self, ci: ClassInfo) -> list[ClassInfo]:
        stack, seen, out = list(ci.subclasses), set(), []
        while stack:
            c = stack.pop()
            if id(c) not in seen:
                seen.add(id(c))
                out.append(c)
                stack.extend(c.subclasses)
        return out

    def callees(self, fn: FunctionInfo) -> list[tuple[FunctionInfo, ast.Call]]:
        """Project functions `fn` calls, with the call node (constructors resolve to ``__init__``)."""
        cached = self._callee_cache.get(id(fn))
        if cached is not None:
            return cached
        out: list[tuple[FunctionInfo, ast.Call]] = []
        for call in fn.calls:
            for target in self._call_targets(call, fn):
                out.append((target, call))
                out += [(f, call) for f in registered_callables(self, call, fn, target)]  # hooks.fire(b): each hook
        out += descriptor_calls(self, fn)  # batch.host_seq_lens of a descriptor: its __get__ runs
        out += module_hooks(self, fn)  # mod.register_forward_pre_hook(hook): mod's forward runs it
        called = {id(call) for _, call in out}
        for call in fn.calls:  # await loop.run_in_executor(pool, self._usage, b), pool.submit(f, b).result()
            handed = handed_callable(call, fn) if id(call) not in called else None
            out += [(f, call) for f in self.callables(handed, fn, partials=True)] if handed is not None else []
        self._callee_cache[id(fn)] = out
        return out

    def _call_targets(self, call: ast.Call, fn: FunctionInfo) -> list[FunctionInfo]:
        """The project functions `call` (a call of `fn`) may run, memoised per call: `callers` asks about the same
        calls for every function of a name (each ``forward`` of a project, each ``__init__``)."""
        found = self._targets_memo.get(call)
        if found is None:
            cuts = self.cuts
            found = list(self._call_targets_uncached(call, fn))
            if self.cuts == cuts:  # not cut short by a recursion guard (asked again later, it may know more)
                self._targets_memo[call] = found
        return found

    def _call_targets_uncached(self, call: ast.Call, fn: FunctionInfo) -> Iterator[FunctionInfo]:
        func = call.func
        looked_up = self.registry_classes(func, fn) if not isinstance(func, ast.Name | ast.Attribute) else []
        if looked_up and self.registry_held(func):  # BACKENDS[name](cfg)
            yield from (i for c in looked_up for i in self.constructors(c))
            return
        if isinstance(func, ast.Name) and func.id == "cls" and (built := classmethod_class(fn)) is not None:
            yield from self.constructors(built)  # cls(...) in a classmethod builds its class
            return
        if isinstance(func, ast.IfExp):  # (TrtllmBackend if cfg.trtllm else Backend)(cfg): either's constructor
            for b in branches(func):
                made = self.resolve_def(b, fn) if isinstance(b, ast.Name | ast.Attribute) else None
                yield from self.constructors(made) if isinstance(made, ClassInfo) else []
                yield from [made] if isinstance(made, FunctionInfo) else []
            return
        if isinstance(func, ast.Subscript):  # self.heads[d](x): the item's __call__ (an nn.Module's forward)
            yield from self.instance_call(func, fn)  # self.steps[bs](b): also the functions the items are
            yield from (
                t
                for v, w in (self.container_items(func.value, fn) or [])[:8]
                for t in self.callables(v, w, partials=True)
            )
        if not isinstance(func, (ast.Name, ast.Attribute)):
            return
        base = func.value if isinstance(func, ast.Attribute) else None
        if isinstance(func, ast.Attribute) and isinstance(base, ast.Call) and dotted(base.func) == "super":
            after = self.super_targets(func, fn)  # a mixin's super().m(): the next class of each concrete MRO
            yield from after or [t for t in [self.resolve_def(func, fn)] if isinstance(t, FunctionInfo)]
            return
        if base is None:
            target = self.resolve_def(func, fn)
            picked = target is None and self.registry_held(func)  # cls = BACKENDS[name]; cls(cfg)
            for c in self.registry_classes(func, fn) if picked else ():
                yield from self.constructors(c)
        else:  # resolve_def's attribute case, with the receiver's class kept for what its attributes hold
            assert isinstance(func, ast.Attribute)
            applied = (
                self.resolve_def(base, fn)
                if func.attr == "apply" and isinstance(base, ast.Name | ast.Attribute)
                else None
            )
            if isinstance(applied, ClassInfo) and is_autograd_function(applied):  # Fn.apply(q, k): Fn.forward
                own = self.method(applied, "apply")  # and an apply the Function overrides (not torch's own)
                found = [
                    self.method(applied, "forward"),
                    own if own and own.cls and is_autograd_function(own.cls) else None,
                ]
                yield from (f for f in found if f is not None)
                return
            if isinstance(base, ast.Attribute):  # self.impl = A(cfg) or B(cfg): self.impl.run() runs either's
                classes = self._attr_classes(base, fn) or self.held_classes(base, fn)
                each = [(c, m) for c in classes if (m := self.method(c, func.attr)) is not None]
                if each:  # each class's method (also where only one of them defines it)
                    yield from (m for _, m in each)
                    for c, m in each:  # a class the callers hand (self.attn = attn_backend) declaring it only
                        yield from self.abstract_overrides(base, c, m, fn)
                    return
            inst = self.instance_type(base, fn, 1)
            target = self.method(inst, func.attr) if inst is not None else self._untyped_member(func, fn, 0)
            if target is None and inst is None and isinstance(base, ast.Name):
                # for backend in (self.full, self.linear): backend.init(...) runs the method of each item's class
                items = [m for c in self._item_classes(base, fn) if (m := self.method(c, func.attr)) is not None]
                if items:
                    yield from items
                    return
            if target is None and inst is None and not imported_root(base, fn):
                target = self.sole_method(func.attr)  # self.attn_backend.forward_decode(): the one definer
            if inst is not None and isinstance(target, FunctionInfo):
                yield from self._subclass_targets(base, inst, func.attr, fn)  # List[BaseLayer], backend: Base
                yield from self.protocol_targets(base, inst, func.attr, fn)  # self.reader: LensReader (a Protocol)
                yield from self.abstract_overrides(base, inst, target, fn)  # self.attn.forward_decode() of an ABC
            if inst is not None and target is None:  # self.update = self.update_single_wrapper; self.update()
                held = self.held_callables(inst, func.attr) or list(self.instance_call(func, fn))
                mine = isinstance(base, ast.Name) and base.id == "self"
                declared = isinstance(base, ast.Name) and fn.params.get(base.id) is not None  # may misname the object
                if not held and closed(inst) and not declared:
                    # a mixin's self.fill(), an item an isinstance filter kept: what subclasses define
                    held = list(
                        self.overrides(inst, func.attr) if mine else self._serving_overrides(inst, func.attr, fn)
                    )
                yield from held
                return
        if isinstance(target, ClassInfo):
            yield from self.constructors(target)
            return
        if not isinstance(target, FunctionInfo):
            if target is None:  # attn(q, k, v) on an instance: its class's __call__; run(b) of run = make_step(...)
                yield from self.instance_call(func, fn)
                yield from self.callables(func, fn, partials=True) if isinstance(func, ast.Name) else ()
                named = isinstance(func, ast.Name) and func.id in fn.local_assigns  # cls = resolve(q); cls(*args)
                yield from (i for c in self.loaded_classes(func, fn) for i in self.constructors(c)) if named else ()
            return
        yield target
        yield from self.dispatch_impls(target)  # build_metadata(batch): each @build_metadata.register function
        # self.method() may run an override defined in a subclass.
        is_self_call = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self"
        if is_self_call and target.cls is not None:
            yield from self.overrides(target.cls, target.name)

    def overrides(self, ci: ClassInfo, name: str, *, setters: bool = False) -> Iterator[FunctionInfo]:
        """Methods `name` (setters with `setters`) that subclasses of `ci` define or take from a base before `ci`'s
        branch (``class Sliding(WindowMixin, Paged)``); of a ``typing.Protocol``, also one an implementer inherits."""
        key = (id(ci), name, setters)
        found = self._override_memo.get(key)
        if found is None:
            found = self._override_memo[key] = tuple(self._overrides_uncached(ci, name, setters))
        return iter(found)

    def _overrides_uncached(self, ci: ClassInfo, name: str, setters: bool) -> Iterator[FunctionInfo]:
        structural = not setters and self.is_protocol_class(ci)
        seen: set[int] = set()
        for c in self.subclasses_of(ci):
            table = c.setters if setters else c.methods
            m = table.get(name) if name in table or setters else self.method(c, name)
            if not structural and m is not None and name not in table and any(m.cls is b for b in with_bases(ci)):
                continue  # resolved in ci's own branch: no override
            if m is not None and id(m) not in seen:
                seen.add(id(m))
                yield m

    def all_functions(self) -> Iterator[FunctionInfo]:
        """Every function and every module's top-level code."""
        for mod in self.modules.values():
            if mod.body is not None:
                yield mod.body
        yield from self.functions


_BUILDS = frozenset({"__init__", *POST_INITS})


def _handed_values(f: FunctionInfo) -> Iterator[ast.expr]:
    yield from f.returns
    yield from (a.value for a in f.assigns if a.value is not None)
    for c in f.calls:
        yield from (*c.args, *(k.value for k in c.keywords))


def _super_init(func: ast.expr) -> bool:
    """``super().__init__``."""
    return (
        isinstance(func, ast.Attribute)
        and func.attr == "__init__"
        and isinstance(func.value, ast.Call)
        and isinstance(func.value.func, ast.Name)
        and func.value.func.id == "super"
    )
