"""What an attribute of an object of a known class holds, as the value flow reads it: ``self.x = ...`` in the class and
its bases, dataclass fields by keyword or position (also in ``dataclasses.replace`` and NamedTuple ``_replace``
copies), stores after construction on an object of the class, ``@property`` results, descriptors held by the class
body and, in a base's methods, class attributes its subclasses set again. Part of
`flashcheck.verifier.provenance.flow.ValueFlow`."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from flashcheck.verifier.astutil import dotted
from flashcheck.verifier.copies import copied
from flashcheck.verifier.dataflow import PROPERTIES, arg_for_param
from flashcheck.verifier.index import descendants, field_order, with_bases
from flashcheck.verifier.members import classmethod_class
from flashcheck.verifier.project import ClassInfo, FunctionInfo, Project
from flashcheck.verifier.provenance.calls import CallScan

__all__ = ["ClassAttrs"]

Source = tuple[ast.expr, FunctionInfo]
_MAX_SOURCES = 48


class ClassAttrs:
    """The class-attribute half of `flashcheck.verifier.provenance.flow.ValueFlow`."""

    project: Project
    calls: CallScan
    _class_attrs: dict[tuple[int, str], list[Source]]
    _receivers: dict[int, list[ast.expr]] | None

    if TYPE_CHECKING:

        def instance_type(self, expr: ast.expr, fn: FunctionInfo, depth: int = 0) -> ClassInfo | None: ...

        def item_of_result(self, value: ast.expr, i: int, fn: FunctionInfo, depth: int = 0) -> list[Source]: ...

        def sources(self, expr: ast.expr, fn: FunctionInfo) -> list[Source]: ...

    def class_attr_sources(self, cls: ClassInfo, attr: str) -> list[Source]:
        key = (id(cls), attr)
        found = self._class_attrs.get(key)
        if found is None:
            self._class_attrs[key] = []  # recursion guard
            found = self._class_attrs[key] = self._class_attr_sources(cls, attr)
        return found

    def _class_attr_sources(self, cls: ClassInfo, attr: str) -> list[Source]:
        out: list[Source] = []
        field = False
        for c in with_bases(cls):
            out.extend(c.attr_assigns.get(attr, []))
            out.extend(s for v, i, f in c.attr_unpacks.get(attr, []) for s in self.item_of_result(v, i, f))
            if attr in c.fields:  # dataclass field: the constructor's argument
                field = True
                index = self.calls.keyword_index()
                for v, where, call in [*index.get(f"{c.name}.{attr}", []), *index.get(f"cls.{attr}", [])]:
                    if self.calls.constructs(call, where, c):
                        out.append((v, where))
        if field:
            out.extend(self._positional_fields(cls, attr))
            for f, call in self.calls.replaces():  # dataclasses.replace(meta, is_cuda_graph=True): a copy of it
                value = next((kw.value for kw in call.keywords if kw.arg == attr), None)
                copy = copied(call, f)
                if value is not None and copy is not None and cls in with_bases(self.instance_type(copy[0], f)):
                    out.append((value, f))
        out.extend(self._late_stores(cls, attr))
        out.extend(self._descriptor_reads(out))
        prop = self.project.method(cls, attr)
        if prop is not None and any(dotted(d) in PROPERTIES for d in prop.decorators):
            out.extend((r, prop) for r in prop.returns)  # a @property: what it returns
        return out[:_MAX_SOURCES]

    def built_field(self, expr: ast.Attribute, fn: FunctionInfo) -> Source | None:
        """What field `expr.attr` of a local bound once to a record's construction holds (``plan =
        PrefillPlan(..., num_tokens=n)`` read as ``plan.num_tokens``: ``n``), where nothing in `fn` stores into it;
        None otherwise."""
        v = expr.value
        if not (isinstance(v, ast.Name) and v.id not in fn.params and len(fn.local_assigns.get(v.id, [])) == 1):
            return None
        if any(isinstance(a, ast.Assign | ast.AugAssign | ast.AnnAssign) and _stores_attr(a, v.id) for a in fn.assigns):
            return None  # plan.num_tokens = ... later: not the construction's value alone
        made = self.record_fields(fn.local_assigns[v.id][0], fn)
        fields = dict(made[0]) if len(made) == 1 else {}
        return fields.get(expr.attr)

    def record_fields(self, expr: ast.expr, fn: FunctionInfo) -> list[list[tuple[str, Source | None]]]:
        """The fields of each dataclass construction `expr` may be, in the order ``dataclasses.astuple`` and
        ``asdict`` give them, with the argument each construction passed (None for a field left to its default or
        filled by a ``*spread``):
        ``PlanArgs(self.qo_indptr, ...)`` returned by a method, also ``cls(...)`` in a classmethod constructor and
        through ``dataclasses.replace(args, x=...)``."""
        out: list[list[tuple[str, Source | None]]] = []
        stack: list[tuple[ast.expr, FunctionInfo, dict[str, Source]]] = [(expr, fn, {})]
        seen: set[int] = set()
        while stack and len(seen) < _MAX_SOURCES:
            v, where, over = stack.pop()
            if id(v) in seen:
                continue
            seen.add(id(v))
            copy = copied(v, where)
            if copy is not None:
                assert isinstance(v, ast.Call)
                kept = {kw.arg: (kw.value, where) for kw in v.keywords if kw.arg is not None}
                stack.append((copy[0], where, {**kept, **over}))  # the copy's own keywords win
                continue
            made = self.project.resolve_def(v.func, where) if isinstance(v, ast.Call) else None
            if made is None and isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "cls":
                made = classmethod_class(where)  # cls(...) in a classmethod constructor (PlanArgs.from_meta)
            if isinstance(made, ClassInfo) and self.project.method(made, "__init__") is None and made.fields:
                assert isinstance(v, ast.Call)
                order = field_order(made)
                star = next((i for i, a in enumerate(v.args) if isinstance(a, ast.Starred)), len(v.args))
                if star > len(order):
                    continue
                passed: dict[str, Source] = {f: (a, where) for f, a in zip(order, v.args[:star], strict=False)}
                passed.update((kw.arg, (kw.value, where)) for kw in v.keywords if kw.arg in order)
                passed.update((k, s) for k, s in over.items() if k in order)
                out.append([(f, passed.get(f)) for f in order])
            elif isinstance(v, ast.Name | ast.Attribute | ast.Call):
                stack.extend((s, w, over) for s, w in self.sources(v, where))  # a factory: what it returns
        return out

    def _descriptor_reads(self, values: list[Source]) -> list[Source]:
        """What reading a class attribute that holds a descriptor gives (``last_page_len = DeviceBuffer(...)`` in the
        class body, whose ``__get__`` returns the buffer): the values its ``__get__`` returns."""
        out: list[Source] = []
        for v, where in values:
            if isinstance(where.node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue  # an instance attribute: Python calls __get__ only for what the class body holds
            made = self.project.resolve_def(v.func, where) if isinstance(v, ast.Call) else None
            getter = self.project.method(made, "__get__") if isinstance(made, ClassInfo) else None
            if getter is not None:
                out.extend((r, getter) for r in getter.returns)
        return out

    def _subclass_defaults(self, base: ClassInfo, attr: str, fn: FunctionInfo) -> list[Source]:
        """Class attributes that subclasses of `base` set in their bodies (``decode_backend = "trtllm-gen"`` over the
        base's ``"fa2"``): what ``self.attr`` holds in `fn`, a method of `base`, for the subclasses that run `fn`
        itself or through ``super()`` (not one that overrides it without) and, in serving code, not those of tests and
        benchmarks."""
        serving = not fn.source.is_tooling
        kept = [
            d
            for d in descendants(base)
            if attr in d.attr_assigns
            and not (serving and d.module.source.is_tooling)
            and _runs(self.project.method(d, fn.name), fn)
        ]
        return [(v, w) for d in kept for v, w in d.attr_assigns[attr] if w.cls is not d]

    def _positional_fields(self, cls: ClassInfo, attr: str) -> list[Source]:
        """Positional constructor arguments for a field: the class's ``__init__`` parameter of that name, or the
        field's place in the dataclass order (bases' fields first) when the class defines no ``__init__``."""
        init = self.project.method(cls, "__init__")
        if init is not None:
            return [
                (arg, caller)
                for caller, call in self.project.callers(init)
                if call.args and (arg := arg_for_param(call, init, attr)) is not None
            ]
        order = field_order(cls)
        i = order.index(attr) if attr in order else len(order)
        out: list[Source] = []
        for caller, call in self.calls.class_calls().get(cls.name, []):
            args = call.args
            fits = i < len(args) and not any(isinstance(a, ast.Starred) for a in args[: i + 1])
            if fits and self.calls.constructs(call, caller, cls):
                out.append((args[i], caller))
        return out

    def _late_stores(self, cls: ClassInfo, attr: str) -> list[Source]:
        """``obj.attr = value`` on another object whose type is `cls` (or a subclass): a field set after
        construction (``ret = cls(...); ret.seq_lens = ...``, ``batch.seq_lens = ...`` on a returned batch)."""
        out: list[Source] = []
        receivers = self._store_receivers()
        serving = not cls.module.source.is_tooling
        for value, where in self.project.attr_stores.get(attr, []):
            if serving and where.source.is_tooling:
                continue  # a test's store says nothing of what the engine's objects hold
            for receiver in receivers.get(id(value), []):
                owner_cls = self.instance_type(receiver, where)
                if owner_cls is not None and (cls in with_bases(owner_cls) or owner_cls in with_bases(cls)):
                    out.append((value, where))
                    break
        return out

    def _store_receivers(self) -> dict[int, list[ast.expr]]:
        """The receivers of ``obj.attr = value`` stores (``obj``), by the stored value's node."""
        if self._receivers is None:
            self._receivers = {}
            for f in self.project.all_functions():
                for a in f.assigns:
                    if isinstance(a, ast.Assign):
                        for t in a.targets:
                            if isinstance(t, ast.Attribute) and not (
                                isinstance(t.value, ast.Name) and t.value.id == "self"
                            ):
                                self._receivers.setdefault(id(a.value), []).append(t.value)
        return self._receivers


def _runs(method: FunctionInfo | None, base_method: FunctionInfo) -> bool:
    """Whether an instance whose class resolves `base_method`'s name to `method` runs `base_method`: the same
    method, or an override that calls ``super().name(...)``."""
    if method is None or method is base_method:
        return method is not None
    return any(
        isinstance(f := c.func, ast.Attribute)
        and f.attr == base_method.name
        and isinstance(f.value, ast.Call)
        and dotted(f.value.func) == "super"
        for c in method.calls
    )


def _stores_attr(a: ast.stmt, name: str) -> bool:
    """Whether assignment `a` stores into an attribute of the local `name` (``name.x = ...``, ``name.x += ...``)."""
    targets = (
        a.targets if isinstance(a, ast.Assign) else [a.target] if isinstance(a, ast.AugAssign | ast.AnnAssign) else []
    )
    return any(isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == name for t in targets)
