"""Which classes' methods a call on an object runs when the object may be of several classes: an attribute whose
stores build different classes (``self.impl = ChunkedImpl(cfg)`` or ``FullImpl(cfg)``), a loop variable over
objects of several classes (``for layer in self.layers`` over attention and Mamba layers), an item of a container
filled with several (``self.heads[kind](x)``), and the ``__call__`` (an ``nn.Module``'s ``forward``) that calling
such an object runs. Part of `flashcheck.verifier.project.Project`'s call graph."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from flashcheck.verifier.astutil import branches, dotted, is_abstract, is_none, is_protocol, terminal_name
from flashcheck.verifier.dynamic_imports import class_values
from flashcheck.verifier.factories import factory_classes
from flashcheck.verifier.index import ClassInfo, FunctionInfo, derives, descendants, owner_of, with_bases
from flashcheck.verifier.instances import argument, torch_module
from flashcheck.verifier.loops import loop_containers
from flashcheck.verifier.registries import Registries
from flashcheck.verifier.sequences import grown

__all__ = ["InstanceCalls", "closed", "link_protocols", "resolution_order"]


class InstanceCalls(Registries):
    """The dispatch half of `flashcheck.verifier.project.Project` for objects of several classes."""

    if TYPE_CHECKING:
        _c3_orders: dict[int, list[ClassInfo] | None]

        def overrides(self, ci: ClassInfo, name: str, *, setters: bool = False) -> Iterator[FunctionInfo]: ...

        def subclasses_of(self, ci: ClassInfo) -> list[ClassInfo]: ...

        def feeding_callers(self, fn: FunctionInfo) -> list[tuple[FunctionInfo, ast.Call]]: ...

        def is_protocol_class(self, ci: ClassInfo) -> bool: ...

        def _call_targets(self, call: ast.Call, fn: FunctionInfo) -> list[FunctionInfo]: ...

    def loaded_classes(self, expr: ast.expr, fn: FunctionInfo) -> list[ClassInfo]:
        """The classes an expression that holds a class may be (`flashcheck.verifier.dynamic_imports.class_values`:
        a factory's returns, a member of a module imported by name, ``getattr(import_module(m), name)``)."""
        return class_values(self, expr, fn)

    def built_by_name(self, call: ast.Call, factory: FunctionInfo, fn: FunctionInfo) -> list[ClassInfo]:
        """The classes a factory that resolves a class by name and builds it (``cls = resolve(qualname); return
        cls(*args)``) builds for this call (`call`, in `fn`): the names this call passes decide."""
        found: dict[int, ClassInfo] = {}
        for r in factory.returns[:4]:
            made = r.func if isinstance(r, ast.Call) and isinstance(r.func, ast.Name) else None
            held = factory.local_assigns.get(made.id, []) if made is not None else []
            for v in held if len(held) == 1 else []:
                found.update((id(c), c) for c in class_values(self, v, factory, 0, ((call, fn),)))
        return list(found.values())

    def built_one_by_name(self, call: ast.Call, factory: FunctionInfo, fn: FunctionInfo) -> ClassInfo | None:
        """`built_by_name` where it names one class (instantiate(table["sampler"], cfg): a Sampler)."""
        found = self.built_by_name(call, factory, fn)
        return found[0] if len(found) == 1 else None

    def _attr_classes(self, attr: ast.Attribute, fn: FunctionInfo) -> list[ClassInfo]:
        """The classes an attribute's stores construct, where they differ (``self.impl = ChunkedImpl(cfg)`` in one
        branch, ``FullImpl(cfg)`` in the other, or ``cls(cfg)`` of a class picked from a registry), or bound from a
        constructor's parameter (each class the calls made for an object of `attr`'s owner pass); else empty."""
        owner = self.instance_type(attr.value, fn, 1)
        found: dict[int, ClassInfo] = {}
        handed = False  # bound from a constructor's parameter: the classes the calls for this owner pass
        for c in with_bases(owner) if owner is not None else []:
            for stored, where in c.attr_assigns.get(attr.attr, [])[:8]:
                for value in branches(stored):  # self.backend = A(ws) if fi else B(ws)
                    built = value.func if isinstance(value, ast.Call) and self.registry_held(value.func) else None
                    name = value.id if isinstance(value, ast.Name) else ""
                    if name in where.params and name not in ("self", "cls") and name not in where.local_assigns:
                        held = self.param_classes(name, where, owner)  # self.model = model
                        if any(self.is_protocol_class(t) for t in held):  # declared with a protocol: what callers hand
                            held = [t for t in self._passed_classes(name, where) or [] if not self.is_protocol_class(t)]
                            if not held:
                                return []  # unknown: `protocol_targets` answers
                        elif any(t.subclasses for t in held):  # declared with a base class: what callers hand
                            held = self._passed_classes(name, where) or held
                        elif len(held) > 1 and where.params.get(name) is not None:  # declared with a union:
                            members = {id(t) for t in held}  # the members callers hand, when they are members
                            passed = self._passed_classes(name, where) or []
                            held = passed if passed and all(id(t) in members for t in passed) else held
                        found.update((id(t), t) for t in held)
                        handed = True
                        continue
                    if isinstance(value, ast.Call) and isinstance(value.func, ast.IfExp):  # (A if c else B)(cfg)
                        picked = [self.resolve_def(b, where) for b in branches(value.func)]
                        found.update((id(t), t) for t in picked if isinstance(t, ClassInfo))
                        continue
                    made = self.registry_classes(built, where) if built else [self._value_type(value, where, 1)]
                    if made == [None] and isinstance(value, ast.Call):  # make_backend(cfg) -> A | B: either
                        made = self.returned_union(value, where)
                    if not made and isinstance(value, ast.Call):  # cfg.get_quant_method(self, prefix): per layer
                        made = list(factory_classes(self, value, where, _self_at(owner, where)) or [])
                    if not made and isinstance(value, ast.Call):  # cls = get_backend_cls(name); cls(cfg): any it gives
                        made = list(class_values(self, value.func, where))
                    factory = self.resolve_def(value.func, where) if not made and isinstance(value, ast.Call) else None
                    if isinstance(factory, FunctionInfo) and isinstance(value, ast.Call):  # instantiate(qualname, cfg)
                        made = self.built_by_name(value, factory, where)
                    for t in made:
                        if t is not None:
                            found[id(t)] = t
        return list(found.values()) if len(found) > 1 or (handed and found) else []

    def super_targets(self, func: ast.Attribute, fn: FunctionInfo) -> list[FunctionInfo]:
        """The methods ``super().<name>(...)`` in `fn` may run: for the class the lookup starts after (`fn`'s, or
        the first argument of ``super(Cls, self)``) and each class derived from it, the next class in that class's
        resolution order that defines the method, so a mixin's call continues with whichever class follows the mixin
        in each concrete backend (`super_target` picks one, where the class of ``self`` is known)."""
        start = self._super_start(func, fn)
        if start is None:
            return []
        found = {id(m): m for c in [start, *descendants(start)] if (m := self.super_target(c, start, func.attr))}
        return list(found.values())

    def super_target(self, ctx: ClassInfo, start: ClassInfo, name: str) -> FunctionInfo | None:
        """The method ``name`` that ``super()`` in class `start` runs on an instance of class `ctx`."""
        order = resolution_order(ctx, self._c3_orders)
        at = next((i for i, c in enumerate(order) if c is start), None)
        return None if at is None else next((c.methods[name] for c in order[at + 1 :] if name in c.methods), None)

    def super_runs(self, node: ast.expr, fn: FunctionInfo, ctx: ClassInfo, callee: FunctionInfo) -> bool:
        """Whether ``super().name()`` (`node`, a call in `fn`) may run `callee` on an instance of `ctx` (yes where
        the order of `ctx` does not hold the class the lookup starts after)."""
        assert isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        start = self._super_start(node.func, fn)
        if start is None:
            return True
        found = [self.super_target(c, start, node.func.attr) for c in [ctx, *descendants(ctx)]]  # self may be
        return any(f is None or f is callee for f in found)  # a subclass's, whose order puts another class after

    def _super_start(self, func: ast.Attribute, fn: FunctionInfo) -> ClassInfo | None:
        sup = func.value
        if isinstance(sup, ast.Call) and sup.args:  # super(SlidingWindowMixin, self).forward_extend(...)
            named = self.resolve_def(sup.args[0], fn) if isinstance(sup.args[0], ast.Name | ast.Attribute) else None
            return named if isinstance(named, ClassInfo) else None
        return owner_of(fn).cls

    def held_classes(self, attr: ast.Attribute, fn: FunctionInfo) -> list[ClassInfo]:
        """The classes an attribute holds as classes, not instances (``self.backend_cls = getattr(module,
        cfg.backend_cls)``): a method call through it runs that class's method (``self.backend_cls.metadata_cls()``)."""
        owner = self.instance_type(attr.value, fn, 1)
        stores = [(v, w) for c in with_bases(owner) for v, w in c.attr_assigns.get(attr.attr, [])] if owner else []
        return [c for v, w in stores[:4] if isinstance(v, ast.Call) for c in class_values(self, v, w)]

    def family_stores(self, owner: ClassInfo | None, attr: str) -> list[tuple[ast.expr, FunctionInfo]]:
        """What an attribute of an object of class `owner` may be bound to: ``self.<attr> = v`` in the class, its bases
        and its subclasses (a subclass's constructor may store another class's instance), and ``obj.<attr> = v``
        anywhere (a builder's ``runner.head = TreeHead(w)``)."""
        family = [*with_bases(owner), *self.subclasses_of(owner)] if owner is not None else []
        return [vw for c in family for vw in c.attr_assigns.get(attr, [])] + self.attr_stores.get(attr, [])

    def _item_classes(self, name: ast.Name, fn: FunctionInfo) -> list[ClassInfo]:
        """The classes of the items a loop variable takes from literal tuples or lists of objects whose classes
        differ (``for b in (self.full_backend, self.linear_backend)``), or from a container filled with them
        (``for layer in self.layers``, `element_classes`); empty when one item's class is unknown."""
        if name.id in fn.local_assigns or name.id in fn.params:
            return []
        containers = loop_containers(name.id, fn, name.lineno) or fn.loop_vars.get(name.id, [])
        found: dict[int, ClassInfo] = {}
        for c in containers:
            if not isinstance(c, ast.Tuple | ast.List):
                held = self.element_classes(c, fn)
                if not held:
                    return []
                found.update((id(t), t) for t in held)
                continue
            for e in c.elts[:8]:
                t = self._value_type(e, fn, 1) if not isinstance(e, ast.Starred) else None
                if t is None:
                    return []
                found[id(t)] = t
        return list(found.values())

    def returned_union(self, call: ast.Call, fn: FunctionInfo) -> list[ClassInfo | None]:
        """The project classes a call of a project function declared to return a union of them may give
        (``def make_backend(...) -> FlashInferBackend | TrtllmPath``, also through a module-level alias)."""
        target = self.resolve_def(call.func, fn) if isinstance(call.func, ast.Name | ast.Attribute) else None
        node = target.node if isinstance(target, FunctionInfo) else None
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.returns is None:
            return []
        assert isinstance(target, FunctionInfo)
        found = self._annotation_classes(node.returns, target, 1)
        return list(found) if len(found) > 1 else []

    def object_classes(self, expr: ast.expr, fn: FunctionInfo) -> list[ClassInfo]:
        """The classes the object `expr` names may be: its one class, else those of an attribute whose stores build
        (or are declared to return) different ones."""
        one = self.instance_type(expr, fn, 1)
        if one is not None:
            return [one]
        return self._attr_classes(expr, fn) if isinstance(expr, ast.Attribute) else []

    def instance_call(self, func: ast.expr, fn: FunctionInfo) -> Iterator[FunctionInfo]:
        """``__call__`` (an ``nn.Module``'s ``forward``) of the project classes `func` may be an instance of: its one
        class (``self.tree_attn(q)`` with ``self.tree_attn = TreeAttention(...)``), or each class where the items
        or stores differ (``layer(q)`` for layer in a list of attention and Mamba layers, ``self.heads[kind](x)`` of
        a dict of two head classes); and the overrides in subclasses of a class the object is not seen built as
        (a parameter or attribute declared with a base class)."""
        if isinstance(func, ast.Name) and func.id == "cls":  # cls(...) in a classmethod builds an instance
            return
        several = self._call_classes(func, fn)
        for cls in several or [c for c in [self.instance_type(func, fn, 1)] if c is not None]:
            call = self.method(cls, "__call__")
            if call is None and torch_module(cls):  # an nn.Module's __call__ runs its forward
                call = self.method(cls, "forward")
            if call is None:
                continue
            yield call
            if not several and call.cls is not None and not self.built_as_one(func, fn):
                yield from self.overrides(cls, call.name)  # of the object's class: a subclass of it, not of a base

    def _call_classes(self, func: ast.expr, fn: FunctionInfo) -> list[ClassInfo]:
        """The classes a called object may be of where the analysis sees them (several classes, a constant key's item,
        a constructor parameter's classes); empty where `instance_type` answers alone."""
        if isinstance(func, ast.Name):
            return self._item_classes(func, fn)
        if isinstance(func, ast.Attribute):
            return self._attr_classes(func, fn)
        if isinstance(func, ast.Subscript) and isinstance(func.slice, ast.Constant):  # self.heads["medusa"](x)
            return self._keyed_item_classes(func.value, func.slice.value, fn)
        if isinstance(func, ast.Subscript) and not isinstance(func.slice, ast.Slice):
            return self.element_classes(func.value, fn)
        return []

    def _keyed_item_classes(self, container: ast.expr, key: object, fn: FunctionInfo) -> list[ClassInfo]:
        """The classes of the item a module dict or list literal holds under a constant key or index (``self.heads =
        nn.ModuleDict({"medusa": MedusaHead(), ...})`` read as ``self.heads["medusa"]``), with what is stored under
        that key later (``self.heads["medusa"] = TreeHead(w)``); empty when unknown or grown in bulk."""
        if not isinstance(container, ast.Attribute):
            return []
        owner = self.instance_type(container.value, fn, 1)
        if owner is None or grown(self, container, fn):
            return []
        items: list[tuple[ast.expr, FunctionInfo]] = []
        for value, where in self.family_stores(owner, container.attr)[:8]:
            v = value.args[0] if isinstance(value, ast.Call) and len(value.args) == 1 else value
            if isinstance(v, ast.Dict):
                pairs = zip(v.keys, v.values, strict=True)
                items += [(e, where) for k, e in pairs if isinstance(k, ast.Constant) and k.value == key]
            elif isinstance(v, ast.List | ast.Tuple) and isinstance(key, int) and -len(v.elts) <= key < len(v.elts):
                items.append((v.elts[key], where))
            else:
                return []
        if isinstance(key, str):
            family = [*with_bases(owner), *self.subclasses_of(owner)]
            items += [vw for c in family for vw in c.item_assigns.get(f"{container.attr}[{key!r}]", [])]
        types = [self._value_type(e, where, 1) for e, where in items]
        return [] if not types or None in types else list({id(t): t for t in types if t is not None}.values())

    def built_as_one(self, obj: ast.expr, fn: FunctionInfo) -> bool:
        """Whether every value the analysis sees `obj` bound to is built by calling one project class (``self.head =
        Head()``, items of ``nn.ModuleList([Head() for _ in range(n)])``): then it is of that class, not a subclass.
        An attribute counts the stores of its class, bases and subclasses and ``obj.attr`` stores anywhere (they may
        hold a subclass instance); a container grown in bulk (``self.heads.extend(more)``) is not seen whole."""
        if isinstance(obj, ast.Subscript) and not isinstance(obj.slice, ast.Slice):
            values = None if grown(self, obj.value, fn) else self.container_items(obj.value, fn)
        elif isinstance(obj, ast.Attribute):
            values = self.family_stores(self.instance_type(obj.value, fn, 1), obj.attr)
        elif isinstance(obj, ast.Name) and obj.id not in fn.params:
            values = [(v, fn) for v in fn.local_assigns.get(obj.id, [])]
        else:
            return False
        values = [(v, w) for v, w in values or () if not is_none(v)]  # self.hook = None first, built later
        built = [self.resolve_def(v.func, w) if isinstance(v, ast.Call) else None for v, w in values]
        return bool(built) and all(isinstance(b, ClassInfo) and b is built[0] for b in built)

    def _subclass_targets(self, base: ast.expr, inst: ClassInfo, name: str, fn: FunctionInfo) -> Iterator[FunctionInfo]:
        """The subclass methods a call ``base.name()`` may also run when `base` is declared with the class `inst`: a
        loop variable over a container declared with it (``List[BaseLayer]``): each override; a parameter so
        declared (``backend: AttentionBackendBase``): the methods of the classes its callers hand it, when every
        caller hands an object of a known class (``self``, or one built as that class), else each override outside
        tests and benchmarks."""
        if self.declared_loop_item(base, fn):
            yield from self.overrides(inst, name)
            return
        if not (isinstance(base, ast.Name) and base.id not in fn.local_assigns and fn.params.get(base.id) is not None):
            return
        passed = self._passed_classes(base.id, fn)
        if passed is not None:
            yield from (m for c in passed if c is not inst and (m := self.method(c, name)) is not None)
            return
        yield from self._serving_overrides(inst, name, fn)

    def abstract_overrides(
        self, base: ast.expr, inst: ClassInfo, target: FunctionInfo, fn: FunctionInfo
    ) -> Iterator[FunctionInfo]:
        """The overrides in subclasses of `inst` that a call ``base.name()`` runs when it resolves to a method that
        only declares itself (`is_abstract`: an abstract backend's ``forward_decode``) on an object of class `inst`
        that the analysis does not see built as that class (a backend handed down constructors from a factory): the
        object is a subclass's, outside tests and benchmarks for serving code (``self``, parameters and loop items
        declared with a base class, and protocols, have their own rules)."""
        if target.cls is None or self.is_protocol_class(inst) or not is_abstract(target.node):
            return
        if self.built_as_one(base, fn):
            return
        if isinstance(base, ast.Name) and (base.id in ("self", "cls") or base.id in fn.params):
            return
        if self.declared_loop_item(base, fn):
            return
        built = self._constructed(base, fn)
        if built:  # self.backend: Backend = PagedBackend() if paged else RaggedBackend(): those two
            yield from (m for c in built if (m := self.method(c, target.name)) is not None and m is not target)
            return
        yield from self._serving_overrides(inst, target.name, fn)

    def _constructed(self, obj: ast.expr, fn: FunctionInfo) -> list[ClassInfo]:
        """The classes whose constructors build every value `obj` (an attribute or a local) is seen bound to,
        through both branches of conditional expressions, also behind factory calls whose returns the analysis
        types (`factory_classes`: ``self.quant_method = quant_config.get_quant_method(self, prefix)``, with its
        overrides' ``isinstance`` tests of the layer decided for the object's class); empty when one of them is
        built otherwise."""
        owner = self.instance_type(obj.value, fn, 1) if isinstance(obj, ast.Attribute) else None
        if isinstance(obj, ast.Attribute):
            values = self.family_stores(owner, obj.attr)
        elif isinstance(obj, ast.Name):
            values = [(v, fn) for v in fn.local_assigns.get(obj.id, [])]
        else:
            return []
        if len(values) > 16:
            return []
        found: dict[int, ClassInfo] = {}
        for value, where in values:
            for v in branches(value):
                if isinstance(v, ast.Constant | ast.JoinedStr):  # None, w.quant_method = "block": no object
                    continue
                made = self.resolve_def(v.func, where) if isinstance(v, ast.Call) else None
                if isinstance(made, ClassInfo):
                    found[id(made)] = made
                    continue
                if isinstance(obj, ast.Attribute) and owner and self._stored_elsewhere(value, where, obj.attr, owner):
                    continue  # layer.quant_method = m in a helper that only attention layers call
                given = factory_classes(self, v, where, _self_at(owner, where))
                if given is None:
                    return []
                found.update((id(c), c) for c in given)
        return list(found.values())

    def _stored_elsewhere(self, value: ast.expr, where: FunctionInfo, attr: str, owner: ClassInfo) -> bool:
        """Whether the store of `value` in `where` binds the attribute of an object that cannot be of class `owner`
        (``layer.<attr> = value`` where every caller hands ``layer`` an object of an unrelated class)."""
        for st in where.assigns:
            if st.value is not value:
                continue
            targets = st.targets if isinstance(st, ast.Assign) else [st.target]
            for t in targets:
                if not (isinstance(t, ast.Attribute) and t.attr == attr) or dotted(t.value) == "self":
                    continue
                obj = t.value
                if isinstance(obj, ast.Name) and obj.id in where.params and obj.id not in where.local_assigns:
                    held = self._passed_classes(obj.id, where)
                else:
                    one = self.instance_type(obj, where, 1)
                    held = [one] if one is not None else None
                return bool(held) and not any(_related(c, owner) for c in held or ())
        return False

    def _serving_overrides(self, inst: ClassInfo, name: str, fn: FunctionInfo) -> Iterator[FunctionInfo]:
        """`overrides` of `inst`'s `name` that may run for `fn`: those in tests and benchmarks only for code there."""
        serving = not fn.source.is_tooling
        yield from (m for m in self.overrides(inst, name) if not (serving and m.source.is_tooling))

    def protocol_targets(self, base: ast.expr, inst: ClassInfo, name: str, fn: FunctionInfo) -> Iterator[FunctionInfo]:
        """The methods a call ``base.name()`` runs when `base` is an attribute or a local declared with a
        ``typing.Protocol`` of the project (``self.reader: LensReader = FileReader()``): the methods of the classes
        its stores build when each is known, else those of every class implementing the protocol (parameters and
        loop items so declared are `_subclass_targets`'s)."""
        if not self.is_protocol_class(inst) or (isinstance(base, ast.Name) and base.id in fn.params):
            return
        if self.declared_loop_item(base, fn):
            return
        if isinstance(base, ast.Attribute):
            values = self.family_stores(self.instance_type(base.value, fn, 1), base.attr)
        elif isinstance(base, ast.Name):
            values = [(v, fn) for v in fn.local_assigns.get(base.id, [])]
        else:
            values = []
        built = [self._store_classes(v, w) for v, w in values if not is_none(v)]  # self.drafter = None first
        if built and all(b is not None for b in built):
            classes = {id(c): c for b in built for c in b or ()}
            yield from (m for c in classes.values() if (m := self.method(c, name)) is not None)
            return
        yield from self._serving_overrides(inst, name, fn)

    def _store_classes(self, value: ast.expr, where: FunctionInfo, depth: int = 0) -> list[ClassInfo] | None:
        """The classes of what a store binds, when the analysis knows them and none is a protocol: a constructor
        call, a factory annotated with a class or returning objects of known classes, an alias of an object of a
        known class, a parameter every caller hands an object of a known class; None otherwise."""
        if isinstance(value, ast.Name) and value.id in where.params and value.id not in where.local_assigns:
            passed = self._passed_classes(value.id, where) if value.id not in ("self", "cls") else None
            known = [c for c in passed or () if not self.is_protocol_class(c)]  # self.backend = backend
            return known or None
        built = self.resolve_def(value.func, where) if isinstance(value, ast.Call) else None
        t = built if isinstance(built, ClassInfo) else self._value_type(value, where, 1)
        if t is not None and not self.is_protocol_class(t):
            return [t]
        if isinstance(built, FunctionInfo) and built.returns and depth < 2:  # def make() -> Proto: return Impl()
            each = [self._store_classes(r, built, depth + 1) for r in built.returns[:4]]
            return [c for e in each for c in e or ()] if all(e is not None for e in each) else None
        return None

    def _passed_classes(self, param: str, fn: FunctionInfo, depth: int = 0) -> list[ClassInfo] | None:
        """The classes of what `fn`'s callers pass as `param`, when each is known: ``self`` (the caller's class), an
        object the analysis sees built as one class, or the caller's own parameter that its callers fill so (a model
        handing its ``attn`` on to each layer); None when some caller passes another value."""
        found: dict[int, ClassInfo] = {}
        callers = self.feeding_callers(fn)[:8]
        for caller, call in callers:
            arg = argument(call, fn, param)
            cls = caller.cls if isinstance(arg, ast.Name) and arg.id == "self" else None
            if cls is None and isinstance(arg, ast.Call):  # Batcher(n, LinearCost())
                built = self.resolve_def(arg.func, caller)
                cls = built if isinstance(built, ClassInfo) else None
            if cls is None and arg is not None and self.built_as_one(arg, caller):
                cls = self.instance_type(arg, caller, 1)
            forwarded = isinstance(arg, ast.Name) and arg.id in caller.params and arg.id not in caller.local_assigns
            if cls is None and forwarded and depth < 2 and isinstance(arg, ast.Name) and arg.id != "self":
                inner = self._passed_classes(arg.id, caller, depth + 1)
                if inner is None:
                    return None
                found.update((id(c), c) for c in inner)
                continue
            if cls is None:
                return None
            found[id(cls)] = cls
        return list(found.values()) if callers else None


_MAX_IMPLEMENTERS = 8  # classes implementing one protocol beyond which it stays an interface


def link_protocols(classes: Iterable[ClassInfo]) -> set[int]:
    """Make the classes that implement a ``typing.Protocol`` of the project (every method it declares, own or
    inherited) its subclasses, so that a call on an object declared with the protocol runs theirs, as a call on
    one declared with a base class runs the overrides. A protocol more than `_MAX_IMPLEMENTERS` classes
    implement (one method named ``forward``) stays an interface: nothing is linked. Returns the ``id()`` of every
    protocol."""
    classes = list(classes)
    protocols = [ci for ci in classes if _protocol(ci)]
    ids = {id(p) for p in protocols}
    if not protocols:
        return ids
    definers: dict[str, list[ClassInfo]] = {}
    owned: dict[int, set[str]] = {}  # the method names of a class and its bases, once per class
    for ci in classes:
        for name in ci.methods:
            definers.setdefault(name, []).append(ci)
    for p in protocols:
        declared = [c for c in with_bases(p) if id(c) in ids]  # a protocol's own methods and its protocol bases'
        names = sorted({n for c in declared for n in c.methods if not n.startswith("__")})
        if not names:
            continue
        rarest = min(names, key=lambda n: len(definers.get(n, [])))
        found: list[ClassInfo] = []
        todo, seen = list(definers.get(rarest, [])), set[int]()
        while todo and len(seen) < 256:
            c = todo.pop()
            if id(c) in seen or c is p or id(c) in ids or any(b is p for b in with_bases(c)):
                continue
            seen.add(id(c))
            have = owned.get(id(c))
            if have is None:
                have = owned[id(c)] = {n for b in with_bases(c) for n in b.methods}
            if all(n in have for n in names):
                found.append(c)
                if len(found) > _MAX_IMPLEMENTERS:
                    break  # an interface: nothing is linked
            else:  # a mixin defining part of it: a subclass may define the rest
                todo.extend(c.subclasses)
        if len(found) <= _MAX_IMPLEMENTERS:
            p.subclasses.extend(c for c in found if all(c is not s for s in p.subclasses))
    return ids


def _protocol(ci: ClassInfo) -> bool:
    return is_protocol(ci.node, ci.module.imports)


_NO_METHODS = frozenset({"object", "ABC", "Generic", "Protocol"})


def closed(cls: ClassInfo) -> bool:
    """Whether every base of `cls` is a project class or one that brings no methods (``object``, ``abc.ABC``,
    ``Generic[T]``, ``Protocol``): then a method none of them defines can only be a subclass's (a class built on
    ``torch.Tensor`` or an extension type has methods the project does not see)."""
    for c in with_bases(cls):
        outside = [
            b for b in c.node.bases if terminal_name(b.value if isinstance(b, ast.Subscript) else b) not in _NO_METHODS
        ]
        if len(outside) > len(c.bases):
            return False
    return True


def resolution_order(ci: ClassInfo, memo: dict[int, list[ClassInfo] | None]) -> list[ClassInfo]:
    """The classes a lookup on an instance of `ci` visits: its C3 order over the project-visible bases, or
    breadth-first over them where no order exists (an inconsistent hierarchy, bases out of reach)."""
    order = _c3(ci, memo)
    if order is not None:
        return order
    out: list[ClassInfo] = []
    queue = [ci]
    while queue:
        c = queue.pop(0)
        if all(c is not o for o in out):
            out.append(c)
            queue.extend(c.bases)
    return out


def _c3(ci: ClassInfo, memo: dict[int, list[ClassInfo] | None], depth: int = 0) -> list[ClassInfo] | None:
    """The C3 linearization of `ci` over its project-visible bases, or None (an inconsistent order, or too deep)."""
    if id(ci) in memo:
        return memo[id(ci)]
    memo[id(ci)] = None  # a cycle stays None
    parents = [_c3(b, memo, depth + 1) if depth < 16 else None for b in ci.bases]
    if any(p is None for p in parents):
        return None
    seqs = [list(p) for p in parents if p] + ([list(ci.bases)] if ci.bases else [])
    out = [ci]
    while seqs:
        head = next((s[0] for s in seqs if not any(s[0] is c for t in seqs for c in t[1:])), None)
        if head is None:
            return None
        out.append(head)
        seqs = [rest for s in seqs if (rest := [c for c in s if c is not head])]
    memo[id(ci)] = out
    return out


def _related(a: ClassInfo, b: ClassInfo) -> bool:
    """Whether one object may be of both classes: one derives from the other, or a class derives from both
    (``HybridLinear(LinearBase, KVLayer)``)."""
    return derives(a, b) or derives(b, a) or any(derives(d, b) for d in descendants(a))


def _self_at(owner: ClassInfo | None, where: FunctionInfo) -> ClassInfo | None:
    """The class of ``self`` in `where` when it stores an attribute of an object of class `owner`: `owner` where
    `where` is a method of one of its bases (``LinearBase.__init__`` run for a ``ColumnParallelLinear``)."""
    return owner if owner is not None and where.cls is not None and derives(owner, where.cls) else None
