"""The project index with name resolution and a call graph between its functions.

Calls are resolved on demand, intra-project only: plain names, nested and imported functions, ``self.method()``
(including overrides in subclasses), ``super().method()``, attributes whose type is known from ``self.x =
Class(...)``, an annotation, a dataclass field or the arguments callers pass, module aliases (also across
namespace packages), simple local aliases, and callables an attribute holds (``self.update =
self.update_single_wrapper``: ``obj.update()`` calls it). `Project.property_reads` lists the ``@property`` getters a
function runs by reading attributes, which hot-path reachability follows as calls.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from flashcheck.verifier.astutil import dotted
from flashcheck.verifier.index import (
    ClassInfo,
    FunctionInfo,
    ModuleIndex,
    ModuleInfo,
    ProjectIndex,
    loop_containers,
    owner_of,
    with_bases,
)
from flashcheck.verifier.returns import returned_class, yielded_class
from flashcheck.verifier.source import SourceFile

PARTIALS = frozenset({"functools.partial", "partial", "types.MethodType", "MethodType"})
PROPERTIES = frozenset({"property", "functools.cached_property", "cached_property"})

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


class Project(ProjectIndex):
    """Index of the parsed files; resolves names and calls between them."""

    def __init__(self, sources: list[SourceFile], indexed: list[ModuleIndex | None] | None = None) -> None:
        super().__init__(sources, indexed)
        self._callers_active: set[int] = set()
        self._held: dict[str, set[str]] | None = None
        self._property_names: frozenset[str] | None = None
        self._methods_by_name: dict[str, list[FunctionInfo]] | None = None
        self._property_cache: dict[int, list[tuple[FunctionInfo, ast.Attribute]]] = {}
        self._return_types: dict[tuple[str, int], ClassInfo | None] = {}  # returns.py
        self._link_classes()

    def forget_answers(self) -> None:
        """Drop the call graph's memos (callers and callees found so far), so that the questions asked next are
        answered as in a model fresh from the files: an answer found while another question was under way may be
        cut short by the recursion guards, so what was asked before may matter. The name index stays: it depends
        on the files alone."""
        self._callee_cache.clear()
        self._property_cache.clear()
        self._return_types.clear()
        self._callers.clear()
        self._callers_active.clear()

    def _link_classes(self) -> None:
        for ci in self.classes.values():
            for b in ci.node.bases:
                target = self.resolve_def(b, ci.module.body)
                if isinstance(target, ClassInfo) and target is not ci:
                    ci.bases.append(target)
                    target.subclasses.append(ci)

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
            return self.lookup(target, depth + 1) if target else self.modules.get(f"{d.name}.{name}")
        if isinstance(d, ClassInfo):
            return self.method(d, name)
        return None

    def method(self, ci: ClassInfo, name: str) -> FunctionInfo | None:
        """`name` looked up along the project-visible bases of `ci` (depth-first, like a simple MRO)."""
        seen: set[int] = set()
        stack = [ci]
        while stack:
            c = stack.pop(0)
            if id(c) in seen:
                continue
            seen.add(id(c))
            if name in c.methods:
                return c.methods[name]
            stack.extend(c.bases)
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

    def instance_type(self, expr: ast.expr, fn: FunctionInfo, depth: int = 0) -> ClassInfo | None:
        """The project class an expression is an instance of, when simple facts say so."""
        if depth > 6:
            return None
        if isinstance(expr, ast.Name):
            if expr.id in ("self", "cls"):
                owner = owner_of(fn)
                return owner.cls if expr.id in owner.params else None
            if expr.id in fn.params:
                return self._value_type(expr, fn, depth + 1)
            declared = self._annotation_class(fn.local_types.get(expr.id), fn, depth + 1)  # meta: Optional[M] = ...
            if declared is not None:
                return declared
            values = [(v, fn) for v in fn.local_assigns.get(expr.id, [])]
            held = loop_containers(expr.id, fn, getattr(expr, "lineno", None)) if not values else None
            if held:  # for layer, kv in zip(self.layers, caches): the items of the container at its position
                return self._same_class([self._element_type(c, fn, depth + 1) for c in held])
            if not values and expr.id in fn.loop_vars:  # for b in self.backends / [b.run() for b in backends]
                return self._same_class([self._element_type(it, fn, depth + 1) for it in fn.loop_vars[expr.id]])
            outer = fn.parent
            while not values and outer is not None and not isinstance(outer.node, ast.Module):
                # a closure's free variable: model = self.model_runner.model; def run_once(): model.forward(...)
                if expr.id in outer.params:
                    return self._value_type(expr, outer, depth + 1)
                values = [(v, outer) for v in outer.local_assigns.get(expr.id, [])]
                outer = outer.parent
            if not values:  # a module global, or one imported from a project module
                values = fn.module.global_values(expr.id)
                target = fn.module.imports.get(expr.id)
                if not values and target:
                    mod = self.lookup(target.rpartition(".")[0])
                    if isinstance(mod, ModuleInfo):
                        values = mod.global_values(target.rpartition(".")[2])
            types = {id(t): t for v, scope in values if (t := self._value_type(v, scope, depth)) is not None}
            return next(iter(types.values())) if len(types) == 1 else None
        if isinstance(expr, ast.Subscript) and not isinstance(expr.slice, ast.Slice):
            return self._element_type(expr.value, fn, depth)  # self.backends[0], self.by_name["decode"]
        if isinstance(expr, ast.Attribute):
            cls = self.instance_type(expr.value, fn, depth + 1)
            if cls is None:
                return None
            for c in [cls, *cls.bases]:
                ann = c.attr_types.get(expr.attr)
                if ann is not None and c.module.body is not None:
                    t = self._annotation_class(ann, c.module.body, depth + 1)
                    if t is not None:
                        return t
                for value, where in c.attr_assigns.get(expr.attr, []):
                    t = self._value_type(value, where, depth + 1)
                    if t is not None:
                        return t
                getter = c.methods.get(expr.attr)  # a @property: what it returns, or says it returns
                if getter is not None and any(dotted(d) in PROPERTIES for d in getter.decorators):
                    return returned_class(self, getter)
        return None

    def _value_type(self, value: ast.expr, fn: FunctionInfo, depth: int) -> ClassInfo | None:
        if isinstance(value, ast.IfExp):  # A(...) if cond else None: the class of the branches that hold an object
            branches = [b for b in (value.body, value.orelse) if not (isinstance(b, ast.Constant) and b.value is None)]
            return self._same_class([self._value_type(b, fn, depth + 1) for b in branches]) if branches else None
        if isinstance(value, ast.Call):
            if imported_name(value.func, fn, "weakref") in _WEAK_PROXIES and value.args:  # weakref.proxy(engine)
                return self._value_type(value.args[0], fn, depth + 1)
            f = value.func
            if isinstance(f, ast.Attribute) and f.attr in _ITEM_GETTERS and value.args:  # self.graphs.get(bs)
                item = self._element_type(f.value, fn, depth + 1)
                if item is not None:
                    return item
            if isinstance(f, ast.Attribute) and f.attr in _MODULE_RETURNS_SELF:  # Model(cfg).to(device).eval()
                inner = self._value_type(f.value, fn, depth + 1)
                if inner is not None and _torch_module(inner):
                    return inner
            target = self.resolve_def(value.func, fn, depth + 1)
            if isinstance(target, ClassInfo):
                return target
            if isinstance(target, FunctionInfo):  # meta = self.backend.build_metadata(...)
                return returned_class(self, target)
            return self._class_held(value.func, fn, depth + 1, target)
        if isinstance(value, ast.Name) and value.id in fn.params:
            if fn.params[value.id] is not None:
                return self._annotation_class(fn.params[value.id], fn, depth + 1)
            if value.id in ("self", "cls") and fn.cls is not None:
                return fn.cls
            for caller, call in self.callers(fn)[:8] if depth < 3 else []:  # filled by callers
                arg = _argument(call, fn, value.id)
                t = self.instance_type(arg, caller, depth + 1) if arg is not None else None
                if t is not None:
                    return t
        if isinstance(value, ast.Attribute | ast.Name | ast.Subscript):  # runner = self.graph_runners[ve][bs]
            return self.instance_type(value, fn, depth + 1)
        return None

    def _element_type(self, container: ast.expr, fn: FunctionInfo, depth: int) -> ClassInfo | None:
        """The one project class of the items of a list, tuple, set or dict (a literal or a comprehension, held in
        a local, a module global or an attribute of an object of known type)."""
        if depth > 4:
            return None
        declared = self._declared_items(container, fn, depth)  # graph_runners: List[Dict[int, CUDAGraphRunner]]
        if declared is not None:
            t = self._annotation_class(declared[0], declared[1], depth + 1)
            if t is not None:
                return t
        values: list[tuple[ast.expr, FunctionInfo]] = []
        if isinstance(container, ast.Name):
            values = [(v, fn) for v in fn.local_assigns.get(container.id, [])]
            body = fn.module.body
            if not values and body is not None:
                values = [(v, body) for v in body.local_assigns.get(container.id, [])]
        elif isinstance(container, ast.Attribute):
            cls = self.instance_type(container.value, fn, depth + 1)  # one hop, as for an attribute
            for c in [cls, *cls.bases] if cls is not None else []:
                values.extend(c.attr_assigns.get(container.attr, []))
        elif isinstance(container, ast.Call):  # for mb in self._split_microbatches(batch)
            gen = self.resolve_def(container.func, fn, depth + 1)
            return yielded_class(self, gen) if isinstance(gen, FunctionInfo) else None
        else:
            values = [(container, fn)]
        items: list[tuple[ast.expr, FunctionInfo]] = []
        for value, where in values[:8]:
            v = value
            while isinstance(v, ast.Call) and v.args and _module_container(v.func, where):
                v = v.args[0]  # nn.ModuleList([Layer(i) for i in ...]): the items of its argument
            if isinstance(v, ast.List | ast.Tuple | ast.Set):
                items.extend((e, where) for e in v.elts if not isinstance(e, ast.Starred))
            elif isinstance(v, ast.ListComp | ast.SetComp | ast.GeneratorExp):
                items.append((v.elt, where))
            elif isinstance(v, ast.Dict):
                items.extend((e, where) for e in v.values)
            elif isinstance(v, ast.DictComp):
                items.append((v.value, where))
        return self._same_class([self._value_type(e, where, depth + 1) for e, where in items[:16]])

    def _declared_items(
        self, container: ast.expr, fn: FunctionInfo, depth: int
    ) -> tuple[ast.expr, FunctionInfo] | None:
        """The annotation of a container's items, with the scope that resolves its names: ``X`` for an attribute,
        parameter or local declared ``List[X]``/``Dict[K, X]``/``Optional[Sequence[X]]``, and for items of items
        (``self.graph_runners[ve][bs]`` of ``List[Dict[int, X]]``)."""
        if depth > 6:
            return None
        ann: ast.expr | None = None
        scope = fn
        if isinstance(container, ast.Name):
            ann = fn.local_types.get(container.id) or fn.params.get(container.id)
        elif isinstance(container, ast.Attribute):
            cls = self.instance_type(container.value, fn, depth + 1)
            for c in with_bases(cls):
                if container.attr in c.attr_types and c.module.body is not None:
                    ann, scope = c.attr_types[container.attr], c.module.body
                    break
        elif isinstance(container, ast.Subscript) and not isinstance(container.slice, ast.Slice):
            outer = self._declared_items(container.value, fn, depth + 1)
            if outer is not None:
                ann, scope = outer
        item = _item_annotation(ann) if ann is not None else None
        return (item, scope) if item is not None else None

    @staticmethod
    def _same_class(types: list[ClassInfo | None]) -> ClassInfo | None:
        """The class when every entry names the same one (None when one is unknown or they differ)."""
        found = {id(t): t for t in types if t is not None}
        return next(iter(found.values())) if len(found) == 1 and None not in types else None

    def _class_held(
        self, func: ast.expr, fn: FunctionInfo, depth: int, target: FunctionInfo | ClassInfo | ModuleInfo | None
    ) -> ClassInfo | None:
        """The class a called expression holds: an attribute assigned a class (``state_class = StateInfo`` in the
        class body, ``self.meta_cls = Metadata``), or a call of a factory whose returns all name one class
        (``state_class_for(cfg)()``); None when the values disagree or are not classes."""
        if depth > 4:
            return None
        values: list[tuple[ast.expr, FunctionInfo]] = []
        if isinstance(func, ast.Attribute) and target is None:
            cls = self.instance_type(func.value, fn, depth + 1)
            for c in [cls, *cls.bases] if cls is not None else []:
                values.extend(c.attr_assigns.get(func.attr, []))
        elif isinstance(func, ast.Name) and target is None:  # ref = weakref.ref(meta); ref()
            values = [(v, fn) for v in fn.local_assigns.get(func.id, [])]
        elif isinstance(func, ast.Call):  # factory()(...)
            factory = self.resolve_def(func.func, fn, depth + 1)
            if isinstance(factory, FunctionInfo):
                values = [(r, factory) for r in factory.returns]
        values = [(b, where) for v, where in values for b in _branches(v)]
        found: dict[int, ClassInfo] = {}
        for v, where in values[:8]:
            if isinstance(v, ast.Constant) and v.value is None:
                continue
            if isinstance(v, ast.Call) and imported_name(v.func, where, "weakref") in _WEAK_REFS and v.args:
                t: object = self._value_type(v.args[0], where, depth + 1)  # self._meta_ref(): what it refers to
            else:
                t = self.resolve_def(v, where, depth + 1) if isinstance(v, ast.Name | ast.Attribute) else None
            if not isinstance(t, ClassInfo):
                return None
            found[id(t)] = t
        return next(iter(found.values())) if len(found) == 1 else None

    def _annotation_class(self, ann: ast.expr | None, fn: FunctionInfo, depth: int) -> ClassInfo | None:
        if ann is None or depth > 9:
            return None
        if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
            try:
                ann = ast.parse(ann.value, mode="eval").body
            except SyntaxError:
                return None
        if isinstance(ann, ast.Subscript) and dotted(ann.value) in ("Optional", "typing.Optional"):
            return self._annotation_class(ann.slice, fn, depth + 1)  # Optional["KVCacheManager"] too
        if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
            left = self._annotation_class(ann.left, fn, depth + 1)
            return left if left is not None else self._annotation_class(ann.right, fn, depth + 1)
        target = self.resolve_def(ann, fn, depth + 1) if isinstance(ann, (ast.Name, ast.Attribute)) else None
        return target if isinstance(target, ClassInfo) else None

    def _module_under_folders(self, name: str) -> ModuleInfo | None:
        """A regular package inside namespace folders: ``a.b.pkg.mod`` names the module indexed as ``pkg.mod``
        when ``pkg`` sits in folders ``a/b/`` (without ``__init__.py``, so the index names it from ``pkg`` down)."""
        parts = name.split(".")
        for i in range(1, len(parts)):  # the package itself too: a.b.pkg is pkg's __init__.py
            mod = self.modules.get(".".join(parts[i:]))
            if mod is None:
                continue
            path = mod.source.path
            depth = len(parts) - i - (0 if path.name == "__init__.py" else 1)
            folders = path.parents[depth : depth + i]
            if [f.name for f in reversed(folders)] == parts[:i]:
                return mod
        return None

    def _suffix_module(self, name: str) -> ModuleInfo | None:
        """A module whose dotted name ends with `name` (``srt.layers.x`` for ``src.srt.layers.x``), if unique."""
        if not self._suffixes:
            self._suffixes[""] = None
            for full, mod in self.modules.items():
                parts = full.split(".")
                for i in range(1, len(parts) - 1):
                    key = ".".join(parts[i:])
                    self._suffixes[key] = None if key in self._suffixes else mod
        return self._suffixes.get(name)

    # ------------------------------------------------------------------ call graph
    def callers(self, fn: FunctionInfo) -> list[tuple[FunctionInfo, ast.Call]]:
        """Project call sites that may call `fn` (constructor calls for ``__init__``), at most 64."""
        cached = self._callers.get(id(fn))
        if cached is not None:
            return cached
        if id(fn) in self._callers_active or len(self._callers_active) > 3:
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
                    if name is not None:
                        self._calls_by_name.setdefault(name, []).append((caller, call))
        return self._calls_by_name

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
        calls_by_name = self.calls_by_name()
        names = [fn.name, *sorted(self._held_names().get(fn.name, ()))]
        if fn.name == "__init__" and fn.cls is not None:
            names = [fn.cls.name, *(c.name for c in fn.cls.subclasses)]
        out: list[tuple[FunctionInfo, ast.Call]] = []
        for name in names:
            for caller, call in calls_by_name.get(name, [])[:256]:
                if any(t is fn for t in self._call_targets(call, caller)):
                    out.append((caller, call))
        self._callers[id(fn)] = out[:64]
        return out[:64]

    def callees(self, fn: FunctionInfo) -> list[tuple[FunctionInfo, ast.Call]]:
        """Project functions `fn` calls, with the call node (constructors resolve to ``__init__``)."""
        cached = self._callee_cache.get(id(fn))
        if cached is not None:
            return cached
        out: list[tuple[FunctionInfo, ast.Call]] = []
        for call in fn.calls:
            for target in self._call_targets(call, fn):
                out.append((target, call))
        self._callee_cache[id(fn)] = out
        return out

    def _call_targets(self, call: ast.Call, fn: FunctionInfo) -> Iterator[FunctionInfo]:
        func = call.func
        if not isinstance(func, (ast.Name, ast.Attribute)):
            return
        base = func.value if isinstance(func, ast.Attribute) else None
        if base is None or (isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super"):
            target = self.resolve_def(func, fn)
        else:  # resolve_def's attribute case, with the receiver's class kept for what its attributes hold
            assert isinstance(func, ast.Attribute)
            inst = self.instance_type(base, fn, 1)
            target = self.method(inst, func.attr) if inst is not None else self._untyped_member(func, fn, 0)
            if target is None and inst is None and isinstance(base, ast.Name):
                # for backend in (self.full, self.linear): backend.init(...) runs the method of each item's class
                each = [m for c in self._item_classes(base, fn) if (m := self.method(c, func.attr)) is not None]
                if each:
                    yield from each
                    return
            if target is None and inst is None and not _imported_root(base, fn):
                target = self.sole_method(func.attr)  # self.attn_backend.forward_decode(): the one definer
            if inst is not None and target is None:  # self.update = self.update_single_wrapper; self.update()
                held = self.held_callables(inst, func.attr)
                yield from held or self._dunder_call(func, fn)
                return
        if isinstance(target, ClassInfo):
            init = self.method(target, "__init__")
            if init is not None:
                yield init
            return
        if not isinstance(target, FunctionInfo):
            if target is None:  # attn(q, k, v) on an instance: its class's __call__
                yield from self._dunder_call(func, fn)
            return
        yield target
        # self.method() may run an override defined in a subclass.
        is_self_call = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self"
        if is_self_call and target.cls is not None:
            yield from self._overrides(target.cls, target.name)

    def _item_classes(self, name: ast.Name, fn: FunctionInfo) -> list[ClassInfo]:
        """The classes of the items a loop variable takes from literal tuples or lists of objects whose classes
        differ (``for b in (self.full_backend, self.linear_backend)``); empty when one item's class is unknown."""
        if name.id in fn.local_assigns or name.id in fn.params:
            return []
        containers = loop_containers(name.id, fn, name.lineno) or fn.loop_vars.get(name.id, [])
        found: dict[int, ClassInfo] = {}
        for c in containers:
            if not isinstance(c, ast.Tuple | ast.List):
                return []
            for e in c.elts[:8]:
                t = self._value_type(e, fn, 1) if not isinstance(e, ast.Starred) else None
                if t is None:
                    return []
                found[id(t)] = t
        return list(found.values())

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

    def _dunder_call(self, func: ast.Name | ast.Attribute, fn: FunctionInfo) -> Iterator[FunctionInfo]:
        """``__call__`` of the project class `func` is an instance of (``self.tree_attn(q)`` with ``self.tree_attn =
        TreeAttention(...)``), and its overrides in subclasses."""
        if isinstance(func, ast.Name) and func.id == "cls":  # cls(...) in a classmethod builds an instance
            return
        cls = self.instance_type(func, fn, 1)
        call = self.method(cls, "__call__") if cls is not None else None
        if call is None and cls is not None and _torch_module(cls):  # an nn.Module's __call__ runs its forward
            call = self.method(cls, "forward")
        if call is not None:
            yield call
            if call.cls is not None:
                yield from self._overrides(call.cls, call.name)

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
            if getter is None or not any(dotted(d) in PROPERTIES for d in getter.decorators):
                continue
            out.append((getter, node))
            if isinstance(node.value, ast.Name) and node.value.id == "self" and getter.cls is not None:
                out.extend((o, node) for o in self._overrides(getter.cls, node.attr))
        self._property_cache[id(fn)] = out
        return out

    def held_callables(self, cls: ClassInfo, attr: str) -> list[FunctionInfo]:
        """The project functions attribute `attr` of an instance of `cls` holds when it is not a method: a bound
        method or a function assigned to it (``self.update = self.update_single_wrapper``, ``self.step = other.run``,
        either branch of ``a if c else b``), so that ``obj.update(...)`` calls them."""
        values = [v for c in with_bases(cls) for v in c.attr_assigns.get(attr, [])]
        return [t for value, where in values[:8] for t in self.callables(value, where)]

    def callables(
        self, value: ast.expr, fn: FunctionInfo, *, partials: bool = False, depth: int = 0
    ) -> list[FunctionInfo]:
        """The project functions a callable expression names: ``self._forward_decode``, ``helper``, either branch of
        ``a if c else b`` and, with `partials`, the function of ``functools.partial(helper, ...)`` (whose
        arguments no longer line up with the call's)."""
        if depth > 3:
            return []
        if isinstance(value, ast.IfExp):
            return [
                *self.callables(value.body, fn, partials=partials, depth=depth + 1),
                *self.callables(value.orelse, fn, partials=partials, depth=depth + 1),
            ]
        if partials and isinstance(value, ast.Call) and value.args and dotted(value.func) in PARTIALS:
            return self.callables(value.args[0], fn, partials=partials, depth=depth + 1)
        if partials and isinstance(value, ast.Call) and isinstance(value.func, ast.Name | ast.Attribute):
            factory = self.resolve_def(value.func, fn)  # stage = make_stage_fn(w): the closure the factory returns
            rets = factory.returns[:4] if isinstance(factory, FunctionInfo) else []
            return [t for r in rets for t in self.callables(r, factory, partials=True, depth=depth + 1)]  # type: ignore[arg-type]
        if isinstance(value, ast.Name | ast.Attribute):
            target = self.resolve_def(value, fn)
            if isinstance(target, FunctionInfo):
                return [target]
        return []

    def _overrides(self, ci: ClassInfo, name: str) -> Iterator[FunctionInfo]:
        stack, seen = list(ci.subclasses), set()
        while stack:
            c = stack.pop()
            if id(c) in seen:
                continue
            seen.add(id(c))
            if name in c.methods:
                yield c.methods[name]
            stack.extend(c.subclasses)

    def all_functions(self) -> Iterator[FunctionInfo]:
        """Every function and every module's top-level code."""
        for mod in self.modules.values():
            if mod.body is not None:
                yield mod.body
        yield from self.functions


def _argument(call: ast.Call, callee: FunctionInfo, param: str) -> ast.expr | None:
    """The argument a call passes for `param` (keyword, or position after ``self``)."""
    for kw in call.keywords:
        if kw.arg == param:
            return kw.value
    if isinstance(callee.node, ast.Module):
        return None
    names = [a.arg for a in [*callee.node.args.posonlyargs, *callee.node.args.args]]
    if callee.cls is not None and names[:1] == ["self"]:
        names = names[1:]
    i = names.index(param) if param in names else len(call.args)
    return call.args[i] if i < len(call.args) else None


# nn.Module methods that return the module itself
_MODULE_RETURNS_SELF = frozenset(
    {"to", "cuda", "cpu", "eval", "train", "half", "float", "bfloat16", "double", "requires_grad_", "to_empty"}
)
_ITEM_GETTERS = frozenset({"get", "pop", "setdefault"})  # d.get(key): an item of d
_SEQUENCES = frozenset(
    {
        "List",
        "list",
        "Sequence",
        "MutableSequence",
        "Iterable",
        "Set",
        "set",
        "FrozenSet",
        "frozenset",
        "Deque",
        "deque",
        "Tuple",
        "tuple",
    }
)
_MAPPINGS = frozenset({"Dict", "dict", "Mapping", "MutableMapping", "DefaultDict", "defaultdict", "OrderedDict"})


def _item_annotation(ann: ast.expr) -> ast.expr | None:
    """The annotation of the items of a container annotation: ``X`` of ``List[X]``, ``Dict[K, X]``,
    ``Tuple[X, ...]``, ``Optional[Sequence[X]]`` (also written as a string); None for anything else."""
    if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
        try:
            ann = ast.parse(ann.value, mode="eval").body
        except SyntaxError:
            return None
    if not isinstance(ann, ast.Subscript):
        return None
    head = (dotted(ann.value) or "").rsplit(".", 1)[-1]
    args = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
    if head == "Optional" and len(args) == 1:
        return _item_annotation(args[0])
    if head in _MAPPINGS and len(args) == 2:
        return args[1]
    if head in ("Tuple", "tuple") and not (len(args) == 2 and isinstance(args[1], ast.Constant)):
        return None  # Tuple[A, B]: items of different types
    return args[0] if head in _SEQUENCES and args else None


_MODULE_CONTAINERS = frozenset(
    {"torch.nn.ModuleList", "torch.nn.ModuleDict", "torch.nn.Sequential", "list", "tuple", "dict", "set"}
)


def _imported_root(expr: ast.expr, fn: FunctionInfo) -> bool:
    """Whether an attribute chain starts at an imported name (``torch.cuda``, ``np.random``): not a project object."""
    while isinstance(expr, ast.Attribute | ast.Subscript | ast.Call):
        expr = expr.func if isinstance(expr, ast.Call) else expr.value
    return isinstance(expr, ast.Name) and expr.id in fn.module.imports


def _module_container(func: ast.expr, fn: FunctionInfo) -> bool:
    """Whether calling `func` builds a container holding its first argument's items (``nn.ModuleList([...])``)."""
    return imported_name(func, fn, "torch") in _MODULE_CONTAINERS


def _torch_module(cls: ClassInfo) -> bool:
    """Whether `cls` or one of its project bases derives from ``torch.nn.Module`` (also ``nn.Module`` after ``from
    torch import nn``): calling an instance runs its ``forward``."""
    for c in with_bases(cls):
        body = c.module.body
        if body is not None and any(imported_name(b, body, "torch") == "torch.nn.Module" for b in c.node.bases):
            return True
    return False


_WEAK_REFS = frozenset({"weakref.ref", "weakref.ReferenceType", "weakref.WeakMethod"})  # called: the object
_WEAK_PROXIES = frozenset({"weakref.proxy"})  # used as the object itself


def _branches(value: ast.expr) -> list[ast.expr]:
    """The values a conditional expression may take (``weakref.ref(m) if m is not None else None``), else itself."""
    if isinstance(value, ast.IfExp):
        return [*_branches(value.body), *_branches(value.orelse)]
    return [value]


def imported_name(node: ast.AST, fn: FunctionInfo, package: str) -> str | None:
    """The dotted name of `node` with a head imported from `package` spelled out through the module's imports:
    ``flashinfer.BatchDecodeWithPagedKVCacheWrapper`` for ``Decode`` after ``from flashinfer import
    BatchDecodeWithPagedKVCacheWrapper as Decode``, ``torch.empty`` for ``T.empty`` after ``import torch as T``.
    Other names are returned as written (None for anything but a Name/Attribute chain)."""
    name = dotted(node)
    if name is None:
        return None
    head, _, rest = name.partition(".")
    target = fn.module.imports.get(head)
    if target is not None and (target == package or target.startswith(package + ".")):
        return f"{target}.{rest}" if rest else target
    return name


def torch_name(node: ast.AST, fn: FunctionInfo) -> str | None:
    """`imported_name` for torch: ``torch.empty`` for ``empty`` after ``from torch import empty``, for ``E`` after
    ``from torch import empty as E`` and for ``T.empty`` after ``import torch as T``; ``torch.cuda.synchronize`` for
    ``sync`` after ``from torch.cuda import synchronize as sync``."""
    return imported_name(node, fn, "torch")
