"""What project class an expression is an instance of, for the call graph and the rules: annotations (parameters,
fields, locals, containers' items), constructor calls and factories, ``self``, the arguments callers pass, the items of
literal containers and loops, weak references, and ``nn.Module`` methods that return the module. `Project` inherits
it; the call graph (`Project.callers`) answers for parameters no annotation types.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from itertools import chain
from typing import TYPE_CHECKING

from flashcheck.verifier.astutil import (
    annotation,
    branches,
    dotted,
    executed_callable,
    handoff_arguments,
    is_none,
    item_annotation,
    positional_args,
    terminal_name,
)
from flashcheck.verifier.autograd import ctx_shift
from flashcheck.verifier.bindings import ModuleBindings, imported_name
from flashcheck.verifier.copies import copied
from flashcheck.verifier.generics import declared_items, generic_class
from flashcheck.verifier.index import (
    ClassInfo,
    FunctionInfo,
    ModuleInfo,
    owner_of,
    positional_names,
    store_receiver,
    with_bases,
)
from flashcheck.verifier.loops import loop_containers
from flashcheck.verifier.narrowing import isinstance_narrowed
from flashcheck.verifier.reaching import Reaching
from flashcheck.verifier.returns import returned_class, sent_class, yielded_class
from flashcheck.verifier.sequences import fresh_list, grown, local_growth, narrowed_class, sequence_items

__all__ = [
    "PROPERTIES",
    "InstanceTyping",
    "argument",
    "imported_name",
    "torch_module",
    "torch_name",
]

PROPERTIES = frozenset({"property", "functools.cached_property", "cached_property"})
_MAX_DEPTH = 9


class InstanceTyping(ModuleBindings):
    """The typing half of `flashcheck.verifier.project.Project` (name resolution and the call graph are there)."""

    _return_types: dict[tuple[str, int], ClassInfo | None]  # returns.py's memo, made by Project
    _instance_memo: dict[tuple[ast.expr, int, int], ClassInfo | None]  # instance_type's, made by Project
    _params_active: set[tuple[str, int]]  # param_classes' recursion guard, made by Project
    _class_values: dict[tuple[ast.expr, int, int], list[ClassInfo]]  # dynamic_imports.class_values' memo, by Project
    _spelling_fields: set[int]  # dynamic_imports' guard: the config fields being spelled, made by Project
    _grown_memo: dict[str, list[ClassInfo]] | None  # sequences.grown's memo, made by Project
    cuts: int  # how many questions a recursion guard cut short so far (Project.callers)
    reaching: Reaching  # made by Project

    if TYPE_CHECKING:  # resolve_def and lookup: ModuleBindings'

        def method(self, ci: ClassInfo, name: str) -> FunctionInfo | None: ...

        def callers(self, fn: FunctionInfo) -> list[tuple[FunctionInfo, ast.Call]]: ...

        def registry_base(self, func: ast.expr, fn: FunctionInfo) -> ClassInfo | None: ...

        def loaded_classes(self, expr: ast.expr, fn: FunctionInfo) -> list[ClassInfo]: ...

        def built_one_by_name(self, call: ast.Call, factory: FunctionInfo, fn: FunctionInfo) -> ClassInfo | None: ...

        def object_classes(self, expr: ast.expr, fn: FunctionInfo) -> list[ClassInfo]: ...

    def instance_type(self, expr: ast.expr, fn: FunctionInfo, depth: int = 0) -> ClassInfo | None:
        """The project class an expression is an instance of, when simple facts say so (memoised: the answer depends
        on the expression, its function and the depth left alone)."""
        key = (expr, id(fn), depth)
        memo = self._instance_memo
        if key in memo:
            return memo[key]
        cuts = self.cuts
        found = self._instance_type(expr, fn, depth)
        if self.cuts == cuts:  # not cut short by a recursion guard (asked again later, it may know more)
            memo[key] = found
        return found

    def _instance_type(self, expr: ast.expr, fn: FunctionInfo, depth: int) -> ClassInfo | None:
        if depth > _MAX_DEPTH:  # each hop of "attribute <- constructor parameter <- caller's argument" costs two
            return None
        if isinstance(expr, ast.Call):  # get_planner().init_workspace(...): what the factory returns
            return self._value_type(expr, fn, depth + 1)
        if isinstance(expr, ast.Name):
            if expr.id in ("self", "cls"):
                owner = owner_of(fn)
                return owner.cls if expr.id in owner.params else None
            kept = isinstance_narrowed(expr, fn)  # inside if isinstance(meta, DecodeMeta): (meta: a union)
            if kept is not None and isinstance(t := self.resolve_def(kept, fn), ClassInfo):
                return t
            if expr.id in fn.params:
                return self._value_type(expr, fn, depth + 1)
            declared = self._annotation_class(fn.local_types.get(expr.id), fn, depth + 1)  # meta: Optional[M] = ...
            if declared is not None:
                return declared
            values = [(v, fn) for v in self.reaching.keep(fn.local_assigns.get(expr.id, []), expr, fn)]
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
            sent = _yield_unpacked(expr.id, fn) if not values else None
            if sent is not None:  # plan, meta = yield logits: an item of what send() hands in
                return sent_class(self, fn, sent)
            if not values:  # a module global, or one imported from a project module
                values = self.global_values(fn.module, expr.id)
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
                for value, where in chain(c.attr_assigns.get(expr.attr, []), self._stored_on(c, expr.attr, depth)):
                    t = self._value_type(value, where, depth + 1)
                    if t is not None:
                        return t
                getter = c.methods.get(expr.attr)  # a @property: what it returns, or says it returns
                if getter is not None and any(dotted(d) in PROPERTIES for d in getter.decorators):
                    return returned_class(self, getter)
        return None

    def _stored_on(self, cls: ClassInfo, attr: str, depth: int) -> Iterator[tuple[ast.expr, FunctionInfo]]:
        """``obj.<attr> = v`` outside the class, where `obj` is an instance of `cls` or of a subclass (a builder's
        ``layer.attn.backend = backend``), for an attribute the class and its bases never set or only set to None (a
        slot filled from outside): what the class makes itself is its own; stores in tests and benchmarks aside."""
        if any(not is_none(v) for c in with_bases(cls) for v, _ in c.attr_assigns.get(attr, [])):
            return
        for value, where in self.attr_stores.get(attr, [])[:16]:
            if where.source.is_tooling:
                continue  # a test that plants an object
            receiver = store_receiver(where, value, attr)
            t = self.instance_type(receiver, where, depth + 1) if receiver is not None else None
            if t is not None and cls in with_bases(t):
                yield value, where

    def _value_type(self, value: ast.expr, fn: FunctionInfo, depth: int) -> ClassInfo | None:
        if isinstance(value, ast.Await):  # await loop.run_in_executor(pool, runner.execute_model, batch)
            value = value.value
            ran = executed_callable(value)
            target = self.resolve_def(ran, fn, depth + 1) if ran is not None else None
            if isinstance(target, FunctionInfo):
                return returned_class(self, target)
        if isinstance(value, ast.Yield):  # meta = yield out: what send() hands in
            return sent_class(self, fn, None)
        if isinstance(value, ast.IfExp | ast.BoolOp):  # A(...) if c else None, cfg or Config.get_instance(): the
            options = [value.body, value.orelse] if isinstance(value, ast.IfExp) else value.values  # one class of all
            branches = [b for b in options if not (isinstance(b, ast.Constant) and b.value is None)]
            return self._same_class([self._value_type(b, fn, depth + 1) for b in branches]) if branches else None
        if isinstance(value, ast.Call):
            if imported_name(value.func, fn, "weakref") in _WEAK_PROXIES and value.args:  # weakref.proxy(engine)
                return self._value_type(value.args[0], fn, depth + 1)
            copy = copied(value, fn, lambda e, f: self.instance_type(e, f, depth + 1))
            if copy is not None:  # dataclasses.replace(meta, seq_lens=s): an object of meta's class
                return self._value_type(copy[0], fn, depth + 1)
            f = value.func
            if isinstance(f, ast.Attribute) and f.attr in _ITEM_GETTERS and value.args:  # self.graphs.get(bs)
                item = self._element_type(f.value, fn, depth + 1)
                if item is not None:
                    return item
            if isinstance(f, ast.Name) and f.id == "next" and value.args and f.id not in fn.module.functions:
                return self._element_type(value.args[0], fn, depth + 1)  # next(b for b in bs if isinstance(b, P))
            if isinstance(f, ast.Attribute) and f.attr in _MODULE_RETURNS_SELF:  # Model(cfg).to(device).eval()
                inner = self._value_type(f.value, fn, depth + 1)
                if inner is not None and torch_module(inner):
                    return inner
            if isinstance(f, ast.Subscript) and (base := self.registry_base(f, fn)) is not None:
                return base  # KINDS[kind](n): the base every class the registry holds shares
            target = self.resolve_def(value.func, fn, depth + 1)
            if isinstance(target, ClassInfo):
                return target
            if isinstance(target, FunctionInfo):  # meta = self.backend.build_metadata(...)
                ret = getattr(target.node, "returns", None)  # self.decode_slot.get() -> TMeta of MetadataSlot[M]
                bound = isinstance(f, ast.Attribute) and generic_class(self, ret, target, f.value, fn, depth + 1)
                return bound or returned_class(self, target) or self.built_one_by_name(value, target, fn)
            return self._class_held(value.func, fn, depth + 1, target)
        if isinstance(value, ast.Name) and value.id in fn.params:
            ann = fn.params[value.id]
            if ann is not None:
                declared = self._annotation_class(ann, fn, depth + 1)
                if declared is not None or _plain_annotation(ann):
                    return declared  # else a type outside the project (Callable, nn.Module): callers say
            if value.id in ("self", "cls") and fn.cls is not None:
                return fn.cls
            for caller, call in self.callers(fn)[:8] if depth < _MAX_DEPTH - 1 else []:  # filled by callers
                arg = argument(call, fn, value.id)
                t = self.instance_type(arg, caller, depth + 1) if arg is not None else None
                if t is not None:
                    return t
        if isinstance(value, ast.Attribute | ast.Name | ast.Subscript):  # runner = self.graph_runners[ve][bs]
            return self.instance_type(value, fn, depth + 1)
        return None

    def param_classes(
        self, name: str, fn: FunctionInfo, owner: ClassInfo | None = None, *, _hops: int = 0
    ) -> list[ClassInfo]:
        """Every project class a parameter may hold: its annotation's, else each class the callers pass (a pool of
        one class from one caller, of another from the next); with `owner`, only calls made for an object of that
        class (a sibling subclass's ``super().__init__(model)`` or ``self.attach(runner)`` passes its own)."""
        ann = fn.params.get(name)
        declared = self._annotation_classes(ann, fn, 1) if ann is not None else []
        if len(declared) == 1 or (declared and len(self.callers(fn)) > 8):
            return declared
        active = (name, id(fn))
        if active in self._params_active:  # a cycle of objects handing one another on: cut, and say so
            self.cuts += 1
            return []
        self._params_active.add(active)
        try:
            found = self._passed_param_classes(name, fn, owner, declared, _hops)
        finally:
            self._params_active.discard(active)
        if declared:  # a union: the members its callers hand, when every one they hand is a member
            members = {id(c) for c in declared}
            handed = list(found.values())
            return handed if handed and all(id(c) in members for c in handed) else declared
        return list(found.values())

    def _passed_param_classes(
        self, name: str, fn: FunctionInfo, owner: ClassInfo | None, declared: list[ClassInfo], hops: int
    ) -> dict[int, ClassInfo]:
        found: dict[int, ClassInfo] = {}
        family = {id(c) for c in with_bases(owner)} | {id(c) for c in owner.subclasses} if owner is not None else set()
        for caller, call in self.callers(fn)[:8]:
            f = call.func
            on_self = isinstance(f, ast.Attribute) and (
                isinstance(f.value, ast.Call) or (isinstance(f.value, ast.Name) and f.value.id == "self")
            )  # super().__init__(model), self.attach(runner): made for the caller's own object
            if family and caller.cls is not None and id(caller.cls) not in family and on_self:
                continue
            if isinstance(f, ast.Attribute) and f.attr == "__init__" and not isinstance(f.value, ast.Call):
                continue  # Base.__init__(self, ...): its arguments are one place to the right
            built = (
                self.resolve_def(f, caller)
                if family and not on_self and isinstance(f, ast.Name | ast.Attribute)
                else None
            )
            if isinstance(built, ClassInfo) and id(built) not in family:
                continue  # Slow(SlowImpl()) builds a sibling of the owner: not an argument for this object
            arg = argument(call, fn, name)
            handed_on = isinstance(arg, ast.Name) and arg.id in caller.params and arg.id not in ("self", "cls")
            if handed_on and hops < 2 and isinstance(arg, ast.Name):  # the caller's own parameter, of several classes:
                held = self.param_classes(arg.id, caller, _hops=hops + 1)  # a union it declares, what its callers hand
                if len(held) > 1:
                    found.update((id(c), c) for c in held)
                    continue
            t = self.instance_type(arg, caller, 1) if arg is not None else None
            if t is not None:
                found[id(t)] = t
            elif isinstance(arg, ast.Attribute) and not declared:  # Model(cfg, self.backend): each class it is seen
                # built as (a base class with subclasses says less than what `overrides` finds: left to it)
                found.update((id(c), c) for c in self.object_classes(arg, caller) if not c.subclasses)
            elif declared:
                return {}  # a caller hands what the analysis cannot type: the declared union stays whole
        return found

    def _element_type(self, container: ast.expr, fn: FunctionInfo, depth: int) -> ClassInfo | None:
        """The one project class of the items of a list, tuple, set or dict (a literal or a comprehension, held in a
        local, a global, an attribute, a loop variable over such lists, or returned by a function so annotated)."""
        if depth > 4:
            return None
        if isinstance(container, ast.Call) and not _module_container(container.func, fn):
            gen = self.resolve_def(container.func, fn, depth + 1)  # for mb in self._split_microbatches(batch)
            if not isinstance(gen, FunctionInfo):
                return None
            ret = getattr(gen.node, "returns", None)  # def entries(...) -> List[CachedImage]
            item = item_annotation(ret) if ret is not None else None
            f = container.func  # self.graphs.values() -> Iterator[V] of a BucketTable[int, GraphEntry]
            bound = generic_class(self, item, gen, f.value, fn, depth + 1) if isinstance(f, ast.Attribute) else None
            if bound is not None:
                return bound
            return self._annotation_class(item, gen, depth + 1) if item is not None else yielded_class(self, gen)
        if isinstance(container, ast.Name) and container.id in fn.loop_vars and container.id not in fn.local_assigns:
            held = loop_containers(container.id, fn, container.lineno) or []  # for es in entries: items of items
            inner = [
                self._element_type(e, w, depth + 1) for c in held for e, w in (self.container_items(c, fn) or [])[:4]
            ]
            if inner and None not in inner:
                return self._same_class(inner)
        return self._same_class(self._item_types(container, fn, depth))

    def element_classes(self, container: ast.expr, fn: FunctionInfo) -> list[ClassInfo]:
        """The project classes of a container's items where they differ (``layers.append(AttentionLayer(...))`` in
        one branch, ``layers.append(MambaLayer(...))`` in the other, then ``self.layers = nn.ModuleList(layers)``);
        empty when one item's class is unknown or all are one class (`instance_type` answers that)."""
        types = self._item_types(container, fn, 1)
        found = {id(t): t for t in types if t is not None}
        return list(found.values()) if len(found) > 1 and None not in types else []

    def _item_types(self, container: ast.expr, fn: FunctionInfo, depth: int) -> list[ClassInfo | None]:
        """The class of each item source of a container (None where unknown): a declared item type of a project
        class, else the items of literals, comprehensions and ``append`` calls of the values it is bound to."""
        while isinstance(container, ast.Subscript) and isinstance(container.slice, ast.Slice):
            container = container.value  # for layer in self.layers[self.start : self.end]: the list's items
        seen = self._seen_item_types(container, fn, depth)
        declared = declared_items(self, container, fn, depth)  # graph_runners: List[Dict[int, CUDAGraphRunner]]
        whole = not grown(self, container, fn, depth)
        if declared is not None and (not seen or None in seen or not whole):  # items seen built: their own classes
            t = self._annotation_class(declared[0], declared[1], depth + 1)
            if t is not None:
                return [t]
        return seen

    def _seen_item_types(self, container: ast.expr, fn: FunctionInfo, depth: int) -> list[ClassInfo | None]:
        typed, items, stored = self._item_sources(container, fn, depth)
        added = [t for e, where in stored[:8] if (t := self._value_type(e, where, depth + 1)) is not None]
        return [*typed, *(self._value_type(e, where, depth + 1) for e, where in items), *added]

    def container_items(self, container: ast.expr, fn: FunctionInfo) -> list[tuple[ast.expr, FunctionInfo]] | None:
        """The item expressions the analysis sees put into a container (literal items, comprehension elements,
        appended and stored values); None where some items are only declared or not seen."""
        typed, items, stored = self._item_sources(container, fn, 1)
        return None if typed or not (items or stored) else [*items, *stored]

    def _item_sources(
        self, container: ast.expr, fn: FunctionInfo, depth: int
    ) -> tuple[list[ClassInfo | None], list[tuple[ast.expr, FunctionInfo]], list[tuple[ast.expr, FunctionInfo]]]:
        """The classes of items known by declaration (None where unknown), the item expressions seen put into the
        container (both values of a conditional), and the values stored into it as an attribute's items."""
        values: list[tuple[ast.expr, FunctionInfo]] = []
        items: list[tuple[ast.expr, FunctionInfo]] = []
        stored: list[tuple[ast.expr, FunctionInfo]] = []  # items stored into an attribute: their classes add
        if isinstance(container, ast.Name):
            values = [(v, fn) for v in fn.local_assigns.get(container.id, [])]
            body = fn.module.body
            if not values and body is not None:
                values = [(v, body) for v in body.local_assigns.get(container.id, [])]
                stored = list(self.module_items().get((fn.module.name, container.id), []))  # _GRAPHS[bs] = Entry(g)
        elif isinstance(container, ast.Attribute):
            cls = self.instance_type(container.value, fn, depth + 1)  # one hop, as for an attribute
            for c in [cls, *cls.bases, *cls.subclasses] if cls is not None else []:  # a subclass may fill it too
                values.extend(c.attr_assigns.get(container.attr, []))
                stored.extend(c.item_assigns.get(container.attr, []))  # self.layers.append(Layer(i))
        else:
            values = [(container, fn)]
        typed: list[ClassInfo | None] = []
        for value, where in self.module_values(values[:8]):
            v = value
            while isinstance(v, ast.Call) and v.args and _module_container(v.func, where):
                v = v.args[0]  # nn.ModuleList([Layer(i) for i in ...]): the items of its argument
                v = v.value if isinstance(v, ast.Starred) else v  # nn.Sequential(*layers)
            declared = declared_items(self, v, where, depth + 1) if isinstance(v, ast.Name) else None
            known = self._annotation_class(declared[0], declared[1], depth + 1) if declared is not None else None
            if known is not None:  # self.layers = layers, declared list[Layer] (a parameter or a local)
                typed.append(known)
            elif isinstance(v, ast.Name) and sum(map(fresh_list, where.local_assigns.get(v.id, ()))) > 1:
                typed.append(None)  # a local name bound to two new lists: which appends fill which is not known
            elif isinstance(v, ast.Name) and v.id in where.local_assigns:  # layers = []; layers.append(Layer(i))
                items.extend(
                    (c.args[0], where)
                    for c in where.calls
                    if isinstance(c.func, ast.Attribute)
                    and c.func.attr == "append"
                    and isinstance(c.func.value, ast.Name)
                    and c.func.value.id == v.id
                    and c.args
                )
                items.extend(  # layers.extend([Draft(w)]); layers += [Draft(w)]
                    (e, where) for grown in local_growth(v.id, where) for e in sequence_items(grown, where)
                )
                reaching = self.reaching.keep(where.local_assigns[v.id], v, where)  # the binding read here
                for bound in reaching:  # layers = [Attn(b), Mamba()]; attn + ssm
                    items.extend((e, where) for e in sequence_items(bound, where))
                if not items and declared is not None:  # declared List[nn.Module], filled elsewhere
                    typed.append(None)
            elif declared is not None:
                typed.append(None)
            elif (kept := narrowed_class(v)) is not None and isinstance(t := self.resolve_def(kept, where), ClassInfo):
                typed.append(t)  # [b for b in backends if isinstance(b, PagedBackend)]
            elif seq := sequence_items(v, where):  # a literal, a comprehension, a concatenation
                items.extend((e, where) for e in seq)
            elif isinstance(v, ast.Dict):
                items.extend((e, where) for e in v.values)
            elif isinstance(v, ast.DictComp):
                items.append((v.value, where))
        branches = [  # layers.append(A() if c else B()): an item of either class (None adds nothing)
            (b, where)
            for e, where in items[:16]
            for b in ((e.body, e.orelse) if isinstance(e, ast.IfExp) else (e,))
            if not (isinstance(b, ast.Constant) and b.value is None)
        ]
        return typed, branches, stored

    def declared_loop_item(self, expr: ast.expr, fn: FunctionInfo) -> bool:
        """`expr` is a loop variable over containers declared with an item class (``List[BaseLayer]``), which may
        hold instances of its subclasses; items the analysis sees built are of their own classes."""
        if not (isinstance(expr, ast.Name) and expr.id in fn.loop_vars and expr.id not in fn.local_assigns):
            return False
        held = loop_containers(expr.id, fn, expr.lineno)
        return bool(held) and all(self._declared_container(c, fn) for c in held or ())

    def _declared_container(self, container: ast.expr, fn: FunctionInfo) -> bool:
        """The container (a slice of it too) is declared with an item class, or is an attribute bound to a local
        or parameter so declared (``blocks: List[BaseBlock] = []``; ``self.layers = nn.ModuleList(blocks)``)."""
        while isinstance(container, ast.Subscript) and isinstance(container.slice, ast.Slice):
            container = container.value
        if declared_items(self, container, fn, 1) is not None:
            return True
        if isinstance(container, ast.Name):  # kept = [b for b in backends if isinstance(b, Paged)]: Paged or below
            return any(narrowed_class(v) is not None for v in fn.local_assigns.get(container.id, [])[:4])
        if not isinstance(container, ast.Attribute):
            return False
        for c in with_bases(self.instance_type(container.value, fn, 1)):
            for bound, where in c.attr_assigns.get(container.attr, [])[:8]:
                v = bound
                while isinstance(v, ast.Call) and v.args and _module_container(v.func, where):
                    v = v.args[0]
                if isinstance(v, ast.Name) and declared_items(self, v, where, 1) is not None:
                    return True
                if narrowed_class(v) is not None:
                    return True
        return False

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
        values = [(b, where) for v, where in values for b in branches(v)]
        found: dict[int, ClassInfo] = {}
        for v, where in values[:8]:
            if isinstance(v, ast.Constant) and v.value is None:
                continue
            if isinstance(v, ast.Call) and imported_name(v.func, where, "weakref") in _WEAK_REFS and v.args:
                t: object = self._value_type(v.args[0], where, depth + 1)  # self._meta_ref(): what it refers to
            elif isinstance(v, ast.Call):  # cls = resolve_obj_by_qualname("pkg.sampler.Sampler"); cls(cfg)
                t = picked[0] if len(picked := self.loaded_classes(v, where)) == 1 else None
            else:
                t = self.resolve_def(v, where, depth + 1) if isinstance(v, ast.Name | ast.Attribute) else None
            if not isinstance(t, ClassInfo):
                return None
            found[id(t)] = t
        return next(iter(found.values())) if len(found) == 1 else None

    def _annotation_classes(
        self, ann: ast.expr | None, fn: FunctionInfo, depth: int, seen: frozenset[str] = frozenset()
    ) -> list[ClassInfo]:
        """Every project class an annotation names: each member of a union (``Union[GqaBackend, MlaBackend]``, ``A |
        B``), also through a module-level alias of one (``DecodeBackend = Union[...]``, each alias followed once),
        else `_annotation_class`'s."""
        ann = annotation(ann)
        if ann is None or depth > 9:
            return []
        if isinstance(ann, ast.Name) and ann.id not in fn.module.classes and fn.module.body is not None:
            if ann.id in seen:
                return []
            held = self.global_values(fn.module, ann.id)  # DecodeBackend = Union[GqaBackend, MlaBackend]
            if len(held) == 1 and isinstance(held[0][0], ast.Subscript | ast.BinOp):
                return self._annotation_classes(held[0][0], held[0][1], depth + 1, seen | {ann.id})
        members: list[ast.expr] = []
        if isinstance(ann, ast.Subscript) and terminal_name(ann.value) == "Union":
            members = list(ann.slice.elts) if isinstance(ann.slice, ast.Tuple) else [ann.slice]
        elif isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
            members = [ann.left, ann.right]
        if not members:
            one = self._annotation_class(ann, fn, depth)
            return [one] if one is not None else []
        found = {id(c): c for m in members for c in self._annotation_classes(m, fn, depth + 1, seen)}
        return list(found.values())

    def _annotation_class(self, ann: ast.expr | None, fn: FunctionInfo, depth: int) -> ClassInfo | None:
        ann = annotation(ann)  # Optional["KVCacheManager"]: KVCacheManager
        if ann is None or depth > 9:
            return None
        if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
            left = self._annotation_class(ann.left, fn, depth + 1)
            return left if left is not None else self._annotation_class(ann.right, fn, depth + 1)
        target = self.resolve_def(ann, fn, depth + 1) if isinstance(ann, (ast.Name, ast.Attribute)) else None
        return target if isinstance(target, ClassInfo) else None


# Annotations that name no object whose methods the project defines: their parameters are not typed by callers
_PLAIN = frozenset(
    {"str", "int", "float", "bool", "bytes", "list", "dict", "tuple", "set", "frozenset", "List", "Dict", "Tuple"}
    | {"Set", "Sequence", "Mapping", "Iterable", "Iterator", "Tensor", "ndarray", "device", "dtype", "Path", "None"}
)


def _plain_annotation(ann: ast.expr) -> bool:
    """A builtin, container, tensor or array annotation (``str``, ``List[int]``, ``torch.Tensor``)."""
    found = annotation(ann)
    if isinstance(found, ast.Subscript):
        found = found.value
    name = dotted(found) if found is not None else None
    return name is not None and name.rsplit(".", 1)[-1] in _PLAIN


def argument(call: ast.Call, callee: FunctionInfo, param: str) -> ast.expr | None:
    """The argument a call passes for `param` (keyword, or position after ``self``)."""
    for kw in call.keywords:
        if kw.arg == param:
            return kw.value
    names = positional_names(callee)[ctx_shift(call, callee) :]  # Fn.apply(q, k) fills forward(ctx, q, k) after ctx
    handed = handoff_arguments(call, param, names)
    if handed is not None:  # functools.reduce(run_stage, stages, ctx): run_stage(ctx, <a stage>)
        return handed
    args = positional_args(call)
    i = names.index(param) if param in names else len(args)
    return args[i] if i < len(args) and not any(isinstance(a, ast.Starred) for a in args[: i + 1]) else None


# nn.Module methods that return the module itself
_MODULE_RETURNS_SELF = frozenset(
    {"to", "cuda", "cpu", "eval", "train", "half", "float", "bfloat16", "double", "requires_grad_", "to_empty"}
)
_ITEM_GETTERS = frozenset({"get", "pop", "setdefault"})  # d.get(key): an item of d
_MODULE_CONTAINERS = frozenset(
    {"torch.nn.ModuleList", "torch.nn.ModuleDict", "torch.nn.Sequential", "list", "tuple", "dict", "set"}
)


def _module_container(func: ast.expr, fn: FunctionInfo) -> bool:
    """Whether calling `func` builds a container holding its first argument's items (``nn.ModuleList([...])``)."""
    return imported_name(func, fn, "torch") in _MODULE_CONTAINERS


def torch_module(cls: ClassInfo) -> bool:
    """Whether `cls` or one of its project bases derives from ``torch.nn.Module`` (also ``nn.Module`` after ``from
    torch import nn``): calling an instance runs its ``forward``."""
    for c in with_bases(cls):
        body = c.module.body
        if body is not None and any(imported_name(b, body, "torch") == "torch.nn.Module" for b in c.node.bases):
            return True
    return False


_WEAK_REFS = frozenset({"weakref.ref", "weakref.ReferenceType", "weakref.WeakMethod"})  # called: the object
_WEAK_PROXIES = frozenset({"weakref.proxy"})  # used as the object itself


def torch_name(node: ast.AST, fn: FunctionInfo) -> str | None:
    """`imported_name` for torch: ``torch.empty`` for ``empty`` after ``from torch import empty``, for ``E`` after
    ``from torch import empty as E`` and for ``T.empty`` after ``import torch as T``; ``torch.cuda.synchronize`` for
    ``sync`` after ``from torch.cuda import synchronize as sync``."""
    return imported_name(node, fn, "torch")


def _yield_unpacked(name: str, fn: FunctionInfo) -> int | None:
    """The position of `name` in a tuple target bound to a ``yield`` (``plan, meta = yield logits``), if it is one."""
    for a in fn.assigns:
        if isinstance(a, ast.Assign) and isinstance(a.value, ast.Yield):
            for t in a.targets:
                elts = t.elts if isinstance(t, ast.Tuple | ast.List) else []
                for i, e in enumerate(elts):
                    if isinstance(e, ast.Starred):
                        break
                    if isinstance(e, ast.Name) and e.id == name:
                        return i
    return None
