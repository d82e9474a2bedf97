"""Where a value comes from, across the project: the expressions a reference may hold.

`ValueFlow.sources` answers "which expressions may this name, attribute, item or call result be?", across function
boundaries (flow-insensitively but for locals, `Reaching`): locals and globals (also after ``global X``), parameters
filled by their callers (and bound by ``functools.partial``/``types.MethodType``), ``self.x`` assigned anywhere in the
class and its bases, attributes of other objects (through their type, known from annotations or by following the value
to a constructor call: dataclass fields by keyword or position, stores after construction, ``@property`` results; or
every ``obj.x = ...`` of the project when the type is unknown), items of lists and dicts (literals, comprehensions,
``append``, ``d[k] = v``, ``self.graphs[mb][bs] = w``), loop variables, and return values of project functions, also
unpacked (``buf, n = self.helper()``). Every analysis (device provenance, wrapper identity, allocations) is built on it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from itertools import chain, islice

from flashcheck.verifier.astutil import branches, dotted, kwargs_param
from flashcheck.verifier.copies import PLAIN_COPIES, copied
from flashcheck.verifier.dataflow import arg_for_param
from flashcheck.verifier.index import descendants, with_bases
from flashcheck.verifier.index import owner_of as owner
from flashcheck.verifier.itemkeys import filtered_items, is_dict_call, item_lookup_keys
from flashcheck.verifier.loops import innermost_loop, loop_containers
from flashcheck.verifier.operator_idioms import applied, getter_parts
from flashcheck.verifier.project import PARTIALS, ClassInfo, FunctionInfo, Project
from flashcheck.verifier.provenance.calls import CallScan, is_partial
from flashcheck.verifier.provenance.fields import ClassAttrs
from flashcheck.verifier.provenance.keyed import (
    KeyedItems,
    last_entries,
    literal_item_stores,
    literal_pairs,
    name_item_stores,
)
from flashcheck.verifier.provenance.local_fields import local_field_sources
from flashcheck.verifier.provenance.positions import PositionalItems
from flashcheck.verifier.provenance.records import record_field_sources

__all__ = ["PARTIALS", "Source", "ValueFlow", "arg_for_param", "is_partial", "owner", "with_bases"]

Source = tuple[ast.expr, FunctionInfo]
_MAX_SOURCES = 48
_MAX_CHAIN = 40  # nested source questions in flight


class ValueFlow(ClassAttrs, KeyedItems, PositionalItems):
    """Sources of references within one project (results are cached per node)."""

    def __init__(self, project: Project) -> None:
        self.project = project
        self.calls = CallScan(project)
        self._self_attrs: dict[str, list[Source]] | None = None
        self._sources: dict[ast.expr, list[Source]] = {}
        self._params: dict[tuple[int, str], list[Source]] = {}
        self._active: set[int] = set()
        self._edepth = 0
        self._elements: dict[ast.expr, list[Source]] = {}
        self._class_attrs: dict[tuple[int, str], list[Source]] = {}
        self._receivers: dict[int, list[ast.expr]] | None = None
        self._unpacks: dict[int, dict[str, list[tuple[ast.expr, int]]]] = {}
        self._class_attr_names: frozenset[str] | None = None
        self._types: dict[ast.expr, ClassInfo | None] = {}
        self._getattr_reads: dict[ast.Call, list[ast.Attribute]] = {}
        self._getter_reads: dict[ast.Call, ast.expr | None] = {}
        self._types_active: set[int] = set()
        self._reaching = project.reaching

    # ------------------------------------------------------------------ references
    def sources(self, expr: ast.expr, fn: FunctionInfo) -> list[Source]:
        """Expressions `expr` may evaluate to (one step back); empty when nothing is known (cached per node)."""
        key = id(expr)
        found = self._sources.get(expr)
        if found is None:
            if key in self._active or len(self._active) > _MAX_CHAIN:
                return []  # a cycle, or a chain too long to follow (the partial answer is not cached)
            self._active.add(key)
            try:
                found = self._sources[expr] = self._sources_uncached(expr, fn)
            finally:
                self._active.discard(key)
        return found

    def _sources_uncached(self, expr: ast.expr, fn: FunctionInfo) -> list[Source]:
        if isinstance(expr, ast.Name):
            placed = self.positional_sources(expr, fn)
            return placed if placed is not None else self.name_sources(expr.id, fn)
        if isinstance(expr, ast.Attribute):
            return self.attr_sources(expr, fn)
        if isinstance(expr, ast.Subscript) and not isinstance(expr.slice, ast.Slice):
            key = expr.slice
            base = expr.value
            keyed = self.keyed_sources(expr, fn)
            if keyed:
                return keyed
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                literal = self._keyed(base, key.value, fn)  # {"paged": wrapper}["paged"]
                if literal is not None:
                    return literal
            placed = self.indexed_sources(expr, fn)  # meta[SEQ_LENS] of tuples: the item at that position
            return placed if placed is not None else self.element_sources(expr.value, fn)
        if isinstance(expr, ast.Call):
            f = expr.func
            if isinstance(f, ast.Attribute) and f.attr in ("get", "pop", "setdefault") and expr.args:
                k = expr.args[0]
                if isinstance(k, ast.Constant) and isinstance(k.value, str):  # d.get("metadata", {})
                    literal = self._keyed(f.value, k.value, fn)
                    if literal is not None:
                        return literal + [(d, fn) for d in expr.args[1:2]]
                given = [(d, fn) for d in expr.args[1:2] if f.attr == "setdefault"]  # cache.setdefault(n, W(...))
                return self.element_sources(f.value, fn) + given
            read = self.getter_read(expr, fn)
            if read is not None:  # seq_lens_of(batch) after `from .batch import seq_lens_of` (an attrgetter there)
                return [(read, fn)]
            target = self.project.resolve_def(f, fn) if isinstance(f, ast.Name | ast.Attribute) else None
            if target is None and isinstance(f, ast.Name | ast.Attribute):  # self.lam(): an instance's forward
                target = next(self.project.instance_call(f, fn), None)
            if isinstance(target, FunctionInfo):  # also what each @target.register implementation returns
                ran = [target, *self.project.dispatch_impls(target)]
                return [(r, t) for t in ran for r in t.returns[:_MAX_SOURCES]][:_MAX_SOURCES]
            if target is None and isinstance(f, ast.Attribute):  # meta.plan_args(): the receiver's class by flow,
                made = [t for t, c in self.project.callees(fn) if c is expr and t.name == f.attr][:4]
                guess = self.project.sole_method(f.attr) if made else None  # not a guess by name alone, unless
                if guess in made and guess.cls not in self._source_classes(f.value, fn):  # the object may be of its
                    made.remove(guess)  # class (meta = Decode(...) or Prefill(...))
                inst = self.instance_type(f.value, fn) if not made else None  # or the receiver's class by flow
                made = made or [m for m in [self.project.method(inst, f.attr) if inst is not None else None] if m]
                return [(r, t) for t in made for r in t.returns[:_MAX_SOURCES]]
        return []

    def _source_classes(self, expr: ast.expr, fn: FunctionInfo) -> list[ClassInfo]:
        """The classes of the values `expr` may be, one step back, where the value flow types them."""
        return [t for v, w in self.sources(expr, fn)[:8] if (t := self.instance_type(v, w)) is not None]

    def attribute_names(self, arg: ast.expr, fn: FunctionInfo, line: int) -> list[str]:
        """The string constants the name argument of ``getattr``/``setattr`` may be: a literal, a constant, or the
        items of the loop around `line` that binds it (``for name in self._STATIC_INPUTS``)."""
        items = self.loop_item_sources(arg.id, fn, line) if isinstance(arg, ast.Name) else None
        starts = list(reversed(items or [(arg, fn)]))  # constants() takes the last first: names in source order
        return [v for v in dict.fromkeys(self.constants(starts)) if isinstance(v, str)]

    def getter_read(self, call: ast.Call, fn: FunctionInfo) -> ast.expr | None:
        """What ``g(obj)`` reads where ``g`` is a module global bound once, in another module, to an
        ``operator.attrgetter``/``itemgetter`` (``obj.seq_lens``); the file's own getters are rewritten at parse
        (`flashcheck.verifier.operator_idioms`). The node is kept, so caches keyed by node stay right."""
        f = call.func
        if not isinstance(f, ast.Name) or len(call.args) != 1 or call.keywords or f.id not in fn.module.imports:
            return None
        if call in self._getter_reads:
            return self._getter_reads[call]
        held = self.project.global_values(fn.module, f.id)
        made = held[0][0] if len(held) == 1 else None
        parts = getter_parts(made) if isinstance(made, ast.Call) else None
        read = applied(parts, call.args[0], call) if parts is not None and parts[0] != "method" else None
        self._getter_reads[call] = read
        return read

    def getattr_reads(self, call: ast.Call, fn: FunctionInfo) -> list[ast.Attribute]:
        """``getattr(obj, name)`` as the attribute reads it may be (``obj.seq_lens``), one per constant name (none
        for an unknown name); the nodes are kept, so caches keyed by node stay right."""
        found = self._getattr_reads.get(call)
        if found is None:
            names = self.attribute_names(call.args[1], fn, call.lineno) if len(call.args) >= 2 else []
            found = [ast.copy_location(ast.Attribute(call.args[0], n, ast.Load()), call) for n in names[:8]]
            self._getattr_reads[call] = found
        return found

    def constants(self, starts: list[Source], limit: int = 64) -> Iterator[object]:
        """The constant values the expressions in `starts` may take, through names, attributes, items, calls, both
        branches of conditional expressions and ``and``/``or`` operands (``backend=self.backend`` reaching
        ``"trtllm-gen"``, ``use_cuda_graph=self.is_cuda_graph`` reaching ``True``); at most `limit` are visited."""
        stack = list(starts)
        seen: set[int] = set()
        while stack and len(seen) < limit:
            e, where = stack.pop()
            if id(e) in seen:
                continue
            seen.add(id(e))
            if isinstance(e, ast.Constant):
                yield e.value
            elif isinstance(e, ast.IfExp):
                stack.extend([(e.body, where), (e.orelse, where)])
            elif isinstance(e, ast.BoolOp):
                stack.extend((v, where) for v in e.values)
            elif isinstance(e, ast.Name | ast.Attribute | ast.Subscript | ast.Call):
                stack.extend(self.sources(e, where))

    def loop_item_sources(self, name: str, fn: FunctionInfo, line: int | None = None) -> list[Source] | None:
        """What the loop variable `name` holds: the items of the container at its position in each loop that binds
        it (zip/enumerate/items), or item i of each tuple the container holds (``for _, h in results``); with `line`,
        only in the innermost loop around it (a name several loops reuse). None when no loop is known."""
        its = loop_containers(name, fn, line)
        if its:
            return [s for it in its for s in self.element_sources(it, fn)][:_MAX_SOURCES]
        loops = fn.loop_items.get(name)
        if loops and line is not None:
            loops = innermost_loop(loops, line)
        if not loops:
            return None
        out: list[Source] = []
        for it, path, _, _ in loops:
            for v, where in self.element_sources(it, fn):
                item: ast.expr | None = v
                for i in path:
                    item = item.elts[i] if isinstance(item, ast.Tuple | ast.List) and i < len(item.elts) else None
                    if item is None:
                        break
                if item is not None:
                    out.append((item, where))
        return out[:_MAX_SOURCES]

    def spread_values(
        self, container: ast.expr, key: str, fn: FunctionInfo, via: ast.Call | None = None
    ) -> list[Source]:
        """What ``**container`` passes as keyword `key`: the value under `key` of each dict literal or ``dict(...)``
        the container may be, and string-keyed stores into it where it is a local (``kw = {...}; if c:
        kw["backend"] = "trtllm-gen"; return kw``). With `via`, a call of `fn`: only what that call passes `fn`."""
        out: list[Source] = []
        # each value with the calls it was reached through, innermost last: a factory's parameters and **kwargs are
        # what that call passed, and stepping out to its caller continues in the caller's own context
        Ctx = tuple[ast.Call, ...]
        stack: list[tuple[ast.expr, FunctionInfo, Ctx]] = [(container, fn, (via,) if via is not None else ())]
        seen: set[tuple[int, ...]] = set()
        while stack and len(seen) < _MAX_SOURCES:
            v, where, ctx = stack.pop()
            via = ctx[-1] if ctx else None
            if (id(v), *map(id, ctx)) in seen:
                continue
            seen.add((id(v), *map(id, ctx)))
            if isinstance(v, ast.Call) and (dotted(v.func) or "").endswith("ChainMap"):
                stack.extend((a, where, ctx) for a in v.args)  # ChainMap(extra, overrides, defaults): each layer
                continue
            if isinstance(v, ast.BinOp) and isinstance(v.op, ast.BitOr):  # base | {"indptr": ...}: both layers
                stack.extend([(v.left, where, ctx), (v.right, where, ctx)])
                continue
            kept = filtered_items(v)  # {k: x for k, x in kw.items() if k in accepted}: some of kw's items, as kw
            if kept is not None:
                stack.append((kept, where, ctx))
                continue
            if isinstance(v, ast.Name) and (passed := self._passed(v, where, via)) is not None:
                stack.append((*passed, ctx[:-1]))  # a parameter of the factory: what the call reached through passed
                continue
            if isinstance(v, ast.Name) and kwargs_param(v.id, where.node):  # def f(kind, **extra): what the call passed
                calls = [(c, call) for c, call in self.project.callers(where) if via is None or call is via][:8]
                for caller, call in calls:
                    out.extend((kw.value, caller) for kw in call.keywords if kw.arg == key)
                    stack.extend((kw.value, caller, ctx[:-1]) for kw in call.keywords if kw.arg is None)
                continue
            if isinstance(v, ast.Name | ast.Attribute | ast.Call) and not is_dict_call(v):
                if isinstance(v, ast.Name):  # kw = base_kwargs(cfg); kw.update(indptr=indptr): stored here
                    out.extend(self._passed(s, w, via) or (s, w) for s, w in name_item_stores({v.id}, key, where))
                inner = (*ctx, v)[-4:] if isinstance(v, ast.Call) else ctx if isinstance(v, ast.Name) else ()
                stack.extend((s, w, inner) for s, w in self.sources(v, where))  # a factory: what it returns
                continue
            if isinstance(v, ast.Dict):  # {**base, "indptr": host}: the last entry under the key wins
                items, spreads = last_entries(v, key)
                out.extend(self._passed(i, where, via) or (i, where) for i in items)
                stack.extend((item, where, ctx) for item in spreads)
            elif is_dict_call(v):
                assert isinstance(v, ast.Call)
                out.extend(
                    self._passed(kw.value, where, via) or (kw.value, where) for kw in v.keywords if kw.arg == key
                )
                stack.extend((a, where, ctx) for a in v.args[:1])  # dict(extra): the dict it copies
            else:
                continue
            out.extend(literal_item_stores(v, key, where))
        return list({id(v): (v, w) for v, w in out}.values())  # a store seen through the literal and its name

    def _passed(self, v: ast.expr, where: FunctionInfo, via: ast.Call | None) -> Source | None:
        """The argument `via`, a call of `where` the walk came through, passes for parameter `v` (None otherwise):
        a factory's parameter is what that call passed, not what every caller passes."""
        if not (isinstance(v, ast.Name) and v.id in where.params and via is not None) or v.id in where.local_assigns:
            return None  # not a parameter, no call to read it from, or re-bound in the builder (indptr = indptr.cpu())
        arg = arg_for_param(via, where, v.id)
        caller = next((c for c, call in self.project.callers(where) if call is via), None) if arg is not None else None
        return (arg, caller) if arg is not None and caller is not None else None

    def positional_sources(self, read: ast.Name, fn: FunctionInfo) -> list[Source] | None:
        """What this read of a name may hold where the place of the read matters (`Reaching`), else None: the
        reaching assignments of a local assigned more than once, or of a parameter re-bound in the function."""
        own = fn.local_assigns.get(read.id)
        kept = [v for v in own or () if self._reaching.reaches(v, read, fn)] if read.id in fn.params else []
        if not own or (read.id in fn.params and not kept):
            return None
        if read.id in fn.params:
            top = {id(st.value) for st in getattr(fn.node, "body", ()) if isinstance(st, ast.Assign | ast.AnnAssign)}
            here = [(v, fn) for v in kept]
            return here if any(id(v) in top for v in kept) else self.param_sources(fn, read.id) + here
        if len(own) < 2:
            return None
        kept_ids = {id(v) for v in self._reaching.keep(own, read, fn)}
        if len(kept_ids) == len(own):
            return None
        found = self.name_sources(read.id, fn)
        return [s for s in found if s[1] is not fn or id(s[0]) in kept_ids or all(s[0] is not v for v in own)]

    def name_sources(self, name: str, fn: FunctionInfo) -> list[Source]:
        if name in fn.params:
            return self.param_sources(fn, name)
        if name in fn.loop_vars:
            found = self.loop_item_sources(name, fn)
            if found is not None:
                return found
            return [s for it in fn.loop_vars[name] for s in self.element_sources(it, fn)][:_MAX_SOURCES]
        scope: FunctionInfo | None = fn
        while scope is not None:
            values = scope.local_assigns.get(name)
            unpacked = self.unpacked(scope).get(name)
            if values or unpacked:
                found = [(v, scope) for v in values or []]
                return found + [s for value, i in unpacked or [] for s in self.item_of_result(value, i, scope)]
            if scope is not fn and name in scope.params:
                return self.param_sources(scope, name)
            scope = scope.parent
        found = fn.module.global_values(name) if fn is not fn.module.body else []
        if not found and name in fn.module.imports:  # from .backends import PLAN_INFO_ATTR: that module's global
            found = self.project.global_values(fn.module, name)
        return found

    def param_sources(self, fn: FunctionInfo, name: str) -> list[Source]:
        """Arguments that callers pass for parameter `name` of `fn` (``self`` is not a value here)."""
        if name in ("self", "cls"):
            return []
        key = (id(fn), name)
        cached = self._params.get(key)
        if cached is not None:
            return cached
        self._params[key] = []  # recursion guard
        out: list[Source] = []
        for caller, call in self.project.feeding_callers(fn):
            arg = arg_for_param(call, fn, name)
            if arg is not None:
                out.append((arg, caller))
        out.extend(self._bound_sources(fn, name))
        if fn.name == "__init__" and fn.cls is not None:  # cls(...) in a classmethod constructs the class
            for caller, call in self.calls.class_calls().get("cls", []):
                if owner(caller).cls is fn.cls and (arg := arg_for_param(call, fn, name)) is not None:
                    out.append((arg, caller))
        node = fn.node
        if not isinstance(node, ast.Module):  # a default is what callers that omit the argument get
            a = node.args
            pos = [*a.posonlyargs, *a.args]
            for p, d in zip(pos[len(pos) - len(a.defaults) :], a.defaults, strict=False):
                if p.arg == name and not (isinstance(d, ast.Constant) and d.value is None):
                    out.append((d, fn))
        self._params[key] = out[:_MAX_SOURCES]
        return self._params[key]

    def _bound_sources(self, fn: FunctionInfo, name: str) -> list[Source]:
        """Arguments that ``functools.partial(fn, a, ...)`` / ``types.MethodType(fn, a)`` bind to `name`."""
        node = fn.node
        if isinstance(node, ast.Module):
            return []
        every = [a.arg for a in [*node.args.posonlyargs, *node.args.args]]
        out: list[Source] = []
        for caller, call in self.calls.bindings().get(id(fn), []):
            target, args = call.args[0], call.args[1:]
            bound_method = (  # partial(self._count, x): x fills the parameter after self
                fn.cls is not None
                and isinstance(target, ast.Attribute)
                and not isinstance(self.project.resolve_def(target.value, caller), ClassInfo)
                and not any(dotted(d) == "staticmethod" for d in node.decorator_list)
            )
            positional = every[1:] if bound_method else every
            for i, a in enumerate(args):
                if isinstance(a, ast.Starred):
                    break
                out.extend([(a, caller)] if i < len(positional) and positional[i] == name else [])
            out.extend((kw.value, caller) for kw in call.keywords if kw.arg == name)
        return out

    def attr_sources(self, expr: ast.Attribute, fn: FunctionInfo, *, by_name: bool = True) -> list[Source]:
        """Values of ``obj.attr``: from the receiver's class when its type is known; otherwise, with `by_name`,
        from every store of an attribute of that name in the project. A field the function itself stored on a
        local object first (``snap.kv_indptr = host[: n + 1]``) is that value (`local_field_sources`)."""
        local = local_field_sources(expr, fn, self.project)
        if local:
            return local
        held = self.module_global(expr, fn)
        if held is not None:  # S.kv_indptr after `from . import state as S`: what the module's global holds
            return held
        fields = record_field_sources(expr, fn, self) if self._record_like(expr.value) else None
        if fields:  # rec.seq_lens of rec = make_record(seq_lens=s): what was passed under that name
            return fields
        cls = self.instance_type(expr.value, fn) if self._typed_attr(expr.attr) else None
        built = self.built_field(expr, fn) if cls is not None else None
        if built is not None:  # plan = PrefillPlan(..., num_tokens=n): this object's field, not every construction's
            return [built]
        if cls is not None:
            found = self.class_attr_sources(cls, expr.attr)
            if isinstance(expr.value, ast.Name) and expr.value.id == "self":  # self may be a subclass's instance
                found = found + self._subclass_defaults(cls, expr.attr, fn)
                if not found:  # a mixin's self: what the classes mixing it in store (through their other bases)
                    found = [s for d in descendants(cls) for s in self.class_attr_sources(d, expr.attr)]
            return found
        if expr.attr in self.project.attr_stores:  # only set from outside (``b = Batch(); b.seq_lens = ...``)
            cls = self.instance_type(expr.value, fn)
            late = self.class_attr_sources(cls, expr.attr) if cls is not None else []
            if late:
                return late
        if not by_name or (isinstance(expr.value, ast.Name) and expr.value.id in ("self", "cls")):
            return []
        # Unknown receiver type: every store of this attribute name in the project (other objects, fields), but
        # a test's or a benchmark's store says nothing of what the engine's code reads
        keyed = ((v, where) for v, where, _ in self.calls.keyword_index().get(f"*.{expr.attr}", []))
        every = chain(self.project.attr_stores.get(expr.attr, []), self.self_attr_index().get(expr.attr, []), keyed)
        serving = not fn.source.is_tooling
        return list(islice((s for s in every if not (serving and s[1].source.is_tooling)), _MAX_SOURCES))

    def module_global(self, expr: ast.Attribute, fn: FunctionInfo) -> list[Source] | None:
        """What ``mod.name`` may hold where ``mod`` is a project module (``S.kv_indptr``): the module's bindings of the
        name, at its top level and in functions that declare it ``global``; None for any other receiver."""
        found = self.project.module_attribute(expr, fn)
        return found[0].global_values(found[1])[:_MAX_SOURCES] if found is not None else None

    def _record_like(self, base: ast.expr) -> bool:
        """A receiver that may be a loose record (a local or a call, not ``self``), where the project makes some."""
        if isinstance(base, ast.Name) and base.id in ("self", "cls"):
            return False
        return isinstance(base, ast.Name | ast.Call) and self.calls.makes_records()

    def _typed_attr(self, attr: str) -> bool:
        """Whether some project class declares, assigns or defines `attr` (only then can typing a receiver help)."""
        if self._class_attr_names is None:
            names: set[str] = set()
            for c in self.project.classes.values():
                names.update(c.attr_assigns, c.attr_types, c.methods, c.attr_unpacks)
            self._class_attr_names = frozenset(names)
        return attr in self._class_attr_names

    def instance_type(self, expr: ast.expr, fn: FunctionInfo, depth: int = 0) -> ClassInfo | None:
        """The project class `expr` is an instance of: the project's own answer (annotations, constructors,
        ``self``), else by value flow to a constructor call (``res = self.verify(...)`` returning
        ``Output(...)``, ``ret = cls(...)`` in a classmethod), when all the constructors agree."""
        if isinstance(expr, ast.Call):
            f = expr.func
            if isinstance(f, ast.Name) and f.id == "cls":
                return owner(fn).cls
            if dotted(f) in PLAIN_COPIES and len(expr.args) == 1:  # copy.copy(self.proto): an object of its class
                return self.instance_type(expr.args[0], fn, depth + 1)
            copy = copied(expr, fn, lambda e, f: self.project.instance_type(e, f, 1))
            if copy is not None:  # dataclasses.replace(meta, seq_lens=s), attrs' evolve, a NamedTuple's _replace
                return self.instance_type(copy[0], fn, depth + 1)
            if isinstance(f, ast.Attribute) and depth < 6:  # step.with_pages(): a fluent method returns the receiver
                inst = self.instance_type(f.value, fn, depth + 1)
                m = self.project.method(inst, f.attr) if inst is not None else None
                if m is not None and m.returns and all(isinstance(r, ast.Name) and r.id == "self" for r in m.returns):
                    return inst
            target = self.project.resolve_def(f, fn) if isinstance(f, ast.Name | ast.Attribute) else None
            if isinstance(target, ClassInfo):
                return target
        elif isinstance(expr, ast.Name | ast.Attribute | ast.Subscript):  # also self.graphs[bs] of a typed table
            cls = self.project.instance_type(expr, fn)
            if cls is not None:
                return cls
        elif isinstance(expr, ast.IfExp | ast.BoolOp):  # A(...) if c else None, cached or A(...)
            branches = [expr.body, expr.orelse] if isinstance(expr, ast.IfExp) else expr.values
            types = {
                id(t): t
                for b in branches
                if not (isinstance(b, ast.Constant) and b.value is None)
                and (t := self.instance_type(b, fn, depth + 1)) is not None
            }
            return next(iter(types.values())) if len(types) == 1 else None
        key = id(expr)
        if (
            depth > 6
            or key in self._types_active
            or not isinstance(expr, ast.Name | ast.Attribute | ast.Call | ast.Subscript)
        ):
            return None
        if expr in self._types:
            return self._types[expr]
        self._types_active.add(key)
        try:
            found: dict[int, ClassInfo] = {}
            for v, where in self.sources(expr, fn)[:8]:
                t = self.instance_type(v, where, depth + 1)
                if t is not None:
                    found[id(t)] = t
        finally:
            self._types_active.discard(key)
        result = self._types[expr] = next(iter(found.values())) if len(found) == 1 else None
        return result

    def element_sources(self, container: ast.expr, fn: FunctionInfo, depth: int = 0) -> list[Source]:
        """What items of `container` may be: list/dict literals and comprehensions, appends, ``d[k] = v``.

        An expression that is not a container (a tensor) is its own element.
        """
        cached = self._elements.get(container)
        if cached is not None:
            return cached
        if depth > 4 or self._edepth > 8:
            return []
        self._edepth += 1
        try:
            found = self._elements[container] = self._element_sources(container, fn, depth)
        finally:
            self._edepth -= 1
        return found

    def _element_sources(self, container: ast.expr, fn: FunctionInfo, depth: int) -> list[Source]:
        if isinstance(container, ast.Name) and self._reaching.not_a_tensor(container, fn):
            return []  # not a tensor here: its items are not a tensor's elements
        if isinstance(container, ast.List | ast.Tuple | ast.Set):
            return [(e, fn) for e in container.elts if not isinstance(e, ast.Starred)]
        if isinstance(container, ast.ListComp | ast.SetComp | ast.GeneratorExp):
            return [(container.elt, fn)]
        if isinstance(container, ast.Dict):
            return [(v, fn) for v in container.values]
        if isinstance(container, ast.IfExp):  # {g: W(...) for g in gs} if cfg.cascade else {}: either's items
            return [s for b in branches(container) for s in self.element_sources(b, fn, depth + 1)][:_MAX_SOURCES]
        if isinstance(container, ast.DictComp):
            return [(container.value, fn)]
        if isinstance(container, ast.Call):
            name = dotted(container.func)
            if name in ("list", "tuple", "sorted", "reversed", "iter") and container.args:
                return self.element_sources(container.args[0], fn, depth + 1)
            if name in ("itertools.chain", "chain") and not container.keywords:  # chain(a, b): the items of each
                return [s for a in container.args for s in self.element_sources(a, fn, depth + 1)][:_MAX_SOURCES]
            if name in ("itertools.chain.from_iterable", "chain.from_iterable") and container.args:
                inner = self.element_sources(container.args[0], fn, depth + 1)  # the items of each item
                return [s for e, where in inner for s in self.element_sources(e, where, depth + 1)][:_MAX_SOURCES]
            f = container.func
            if isinstance(f, ast.Attribute) and f.attr == "values":
                return self.element_sources(f.value, fn, depth + 1)
            if name == "map" and len(container.args) == 2:
                return self._mapped(container.args[0], container.args[1], fn)
            if isinstance(f, ast.Attribute) and f.attr in ("items", "keys") and not container.args:
                return literal_pairs(f.value, f.attr, fn)  # for key, value in {"_use_cuda_graph": False}.items()
            if name in ("range", "enumerate", "zip"):
                return []
        if isinstance(container, ast.Subscript) and isinstance(container.slice, ast.Slice):
            return self.element_sources(container.value, fn, depth + 1)
        if not isinstance(container, ast.Name | ast.Attribute | ast.Subscript | ast.Call):
            return [(container, fn)]
        out: list[Source] = []
        for src, where in self.sources(container, fn):
            out.extend(self.element_sources(src, where, depth + 1))
        out.extend(self._item_stores(container, fn))
        if not out and not self.sources(container, fn):
            return [(container, fn)]
        return out[:_MAX_SOURCES]

    def _mapped(self, func: ast.expr, items: ast.expr, fn: FunctionInfo) -> list[Source]:
        """The items of ``map(func, items)``: what a project function returns, or the attribute an
        ``operator.attrgetter("attn.decode_wrapper")`` (also kept in a module-level name) reads from each item."""
        target = self.project.resolve_def(func, fn) if isinstance(func, ast.Name | ast.Attribute) else None
        if isinstance(target, FunctionInfo):
            return [(r, target) for r in target.returns[:_MAX_SOURCES]]
        body = fn.module.body
        if isinstance(func, ast.Name) and body is not None and len(body.local_assigns.get(func.id, [])) == 1:
            func = body.local_assigns[func.id][0]
        getter = isinstance(func, ast.Call) and (dotted(func.func) or "").endswith("attrgetter") and len(func.args) == 1
        path = func.args[0] if getter and isinstance(func, ast.Call) else None
        if not isinstance(path, ast.Constant) or not isinstance(path.value, str):
            return []
        read: ast.expr = ast.copy_location(ast.Subscript(items, ast.Constant(...), ast.Load()), func)
        for part in path.value.split("."):
            read = ast.copy_location(ast.Attribute(read, part, ast.Load()), func)
        return [(read, fn)]

    def _item_stores(self, container: ast.expr, fn: FunctionInfo) -> Iterator[Source]:
        if isinstance(container, ast.Name):
            if container.id in fn.local_assigns or container.id in fn.params:
                yield from ((v, fn) for v in fn.item_stores.get(container.id, []))
            else:  # a module global: stores from any function of the module
                yield from self.project.module_items().get((fn.module.name, container.id), [])
            for call in fn.calls:
                f = call.func
                if (
                    isinstance(f, ast.Attribute)
                    and f.attr in ("append", "insert")
                    and isinstance(f.value, ast.Name)
                    and f.value.id == container.id
                    and call.args
                ):
                    yield call.args[-1], fn
        elif isinstance(container, ast.Attribute) and (named := self.project.module_attribute(container, fn)):
            yield from self.project.module_items().get((named[0].name, named[1]), [])  # S._STATE: state's global dict
        elif keys := item_lookup_keys(container):  # self.d[k] = v; self.graphs[mb][bs] = w; self.b["cpu"].append(t)
            inner: ast.expr = container
            while isinstance(inner, ast.Subscript):
                inner = inner.value
            owner_cls = self.project.instance_type(inner.value, fn) if isinstance(inner, ast.Attribute) else None
            yield from (vw for c in with_bases(owner_cls) for k in keys for vw in c.item_assigns.get(k, []))

    def self_attr_index(self) -> dict[str, list[Source]]:
        """``self.x = value`` of every class, by attribute name (for receivers of unknown type)."""
        if self._self_attrs is None:
            self._self_attrs = {}
            for c in self.project.classes.values():
                for attr, values in c.attr_assigns.items():
                    self._self_attrs.setdefault(attr, []).extend(values)
        return self._self_attrs
