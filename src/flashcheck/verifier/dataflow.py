"""Where storage comes from: the persistent buffer an expression views, and the allocation that made it.

Both follow slices, views, local aliases, ``self.<attr>`` assignments anywhere in the class (and its bases; in a
method of a base class or mixin, ``self.<attr>`` is also the attribute of each subclass that inherits it),
module globals and, given the project, other objects' attributes whose type is known (``self.backend.kv_indptr``
is the backend class's ``self.kv_indptr``) and ``self.x = other.y`` aliases. `allocations` also follows project
functions that return an allocation (factories, ``lru_cache``'d getters), caches (``_CACHE[key] = torch.empty``) and
module globals that functions set (``global _WS; _WS = torch.empty(...)``).
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from flashcheck.verifier.astutil import (
    dotted,
    handoff_arguments,
    kwarg,
    literal_items,
    positional_args,
    storage_root,
    terminal_name,
)
from flashcheck.verifier.autograd import ctx_shift
from flashcheck.verifier.copies import copied, field_through_copy
from flashcheck.verifier.index import POST_INITS, descendants, field_order, through_class, with_bases
from flashcheck.verifier.index import owner_of as owner
from flashcheck.verifier.itemkeys import keyed_lookup
from flashcheck.verifier.loops import loop_containers
from flashcheck.verifier.project import PROPERTIES, ClassInfo, FunctionInfo, Project, torch_name
from flashcheck.verifier.sequences import sequence_items

__all__ = [
    "ALLOCATORS",
    "PROPERTIES",
    "Key",
    "Typer",
    "allocations",
    "arg_for_param",
    "owner",
    "param_storage_keys",
    "storage_keys",
    "with_bases",
]

Key = tuple[str, str, str]
Typer = Callable[[ast.expr, FunctionInfo], ClassInfo | None]
AttrValues = Callable[[ClassInfo, str], list[tuple[ast.expr, FunctionInfo]]]
ALLOCATORS = frozenset(
    {
        "empty",
        "zeros",
        "ones",
        "full",
        "empty_like",
        "zeros_like",
        "ones_like",
        "full_like",
        "empty_strided",
        "arange",
        "tensor",
        "as_tensor",
        "rand",
        "randn",
        "randint",
    }
)


def storage_keys(
    expr: ast.expr,
    fn: FunctionInfo,
    depth: int = 0,
    project: Project | None = None,
    typer: Typer | None = None,
) -> list[Key]:
    """Keys of the persistent storage an expression views: ``self.x`` (one per class in the MRO) or a global.

    Other objects' attributes are keyed by their class, as `typer` (default: the project's own typing) finds it."""
    if typer is None and project is not None:
        typer = project.instance_type
    root = storage_root(expr)
    if isinstance(root, ast.IfExp) and depth < 4:  # graph = self.graphs[bs] if bs in self.graphs else None
        branches = [b for b in (root.body, root.orelse) if not (isinstance(b, ast.Constant) and b.value is None)]
        return [k for b in branches for k in storage_keys(b, fn, depth + 1, project, typer)]
    if _string_item(root) and depth < 4:  # bufs["kv_indptr"]: the item under that key of whatever bufs is
        assert isinstance(root, ast.Subscript) and isinstance(root.slice, ast.Constant)
        inner = storage_keys(root.value, fn, depth + 1, project, typer)
        if not inner and project is not None:  # a dict handed in by the callers
            inner = param_storage_keys(root.value, fn, depth, project, typer)
        held = _dict_item_keys(root.value, root.slice.value, fn, depth, project, typer)
        return [(a, b, f"{c}[{root.slice.value!r}]") for a, b, c in inner] + held
    if isinstance(root, ast.Name) and depth < 4:
        values = fn.local_assigns.get(root.id)
        if values and root.id not in fn.params:
            keys = [k for v in values for k in storage_keys(v, fn, depth + 1, project, typer)]
            if not keys and len(values) == 1:  # a new buffer that the function then keeps somewhere lasting
                keys = _kept_at(root.id, fn, depth, project, typer)
            return keys if len(values) == 1 else []
        containers = loop_containers(root.id, fn, root.lineno)
        if containers:  # for buf in self.kv_indices: an item shares its container's key; in (self.a, self.b), theirs
            items = [e for c in containers for e in sequence_items(c, fn) or [c]]
            return [k for c in items for k in storage_keys(c, fn, depth + 1, project, typer)]
        if fn.module.global_values(root.id) and root.id not in fn.params:
            return [("global", fn.module.name, root.id)]
        return []
    if isinstance(root, ast.Attribute) and depth < 4 and (through := field_through_copy(root, fn, typer)) is not None:
        # scratch = dataclasses.replace(self.bufs): scratch.kv_indices is self.bufs.kv_indices, unless made anew
        return storage_keys(through[0], through[1], depth + 1, project, typer) if isinstance(through, tuple) else []
    named = project.module_attribute(root, fn) if project is not None and isinstance(root, ast.Attribute) else None
    if named is not None:  # S.kv_indptr after `from . import state as S`: that module's global
        return [("global", named[0].name, named[1])]
    base = root
    while isinstance(base, ast.Attribute | ast.Subscript):
        base = base.value
    if isinstance(base, ast.Name) and base.id == "self":
        cls = owner(fn).cls
        if cls is None:
            return []
        if (
            project is not None
            and isinstance(root, ast.Attribute)
            and not (isinstance(root.value, ast.Name) and root.value.id == "self")
        ):
            other = typer(root.value, fn) if typer is not None else None
            if other is not None:  # self.backend.kv_indptr: the backend's own self.kv_indptr
                return _attr_keys(other, root.attr, depth, project, typer, _declared(root.value, fn, project))
            several = project.object_classes(root.value, fn)
            if several:  # self.backend = make_backend(cfg) -> A | B: either one's self.kv_indptr
                return [k for c in several for k in _attr_keys(c, root.attr, depth, project, typer)]
        if project is not None and isinstance(root, ast.Attribute) and cls is not None:
            via_property = _property_keys(cls, root.attr, depth, project, typer)
            if via_property:
                return via_property
        text = ast.unparse(root)
        # self in a method of a base class or mixin is also an instance of each subclass that inherits it
        keys = [("self", c.qualname, text) for c in [*with_bases(cls), *descendants(cls)]]
        if project is not None and isinstance(root, ast.Attribute) and depth < 3:
            keys.extend(_alias_keys(cls, root.attr, depth, project, typer))
            if isinstance(root.value, ast.Name):  # a field of this (data)class: what its constructor calls pass,
                keys.extend(_field_keys(cls, root.attr, depth, project, typer))  # and what is stored on one later
                keys.extend(_late_keys(cls, root.attr, depth, project, typer))
        return keys
    if project is not None and isinstance(root, ast.Attribute) and depth < 3:
        other = typer(root.value, fn) if typer is not None else None
        if other is not None:
            return _attr_keys(other, root.attr, depth, project, typer, _declared(root.value, fn, project))
        if isinstance(root.value, ast.Name):  # bufs.kv_indptr, bufs = self.graph_bufs (a namespace, a record of no
            held = storage_keys(root.value, fn, depth + 1, project, typer)  # known class): self.graph_bufs.kv_indptr
            held = held or param_storage_keys(root.value, fn, depth + 1, project, typer)
            return [(a, b, f"{c}.{root.attr}") for a, b, c in held if a in ("self", "global")]
    return []


def _dict_item_keys(
    container: ast.expr, key: object, fn: FunctionInfo, depth: int, project: Project | None, typer: Typer | None
) -> list[Key]:
    """Keys of the buffer a dict literal holds under `key`, where `container` is that dict: ``self.graph_bufs =
    {"kv_indices": self.kv_indices}`` makes ``bufs["kv_indices"]`` (after ``bufs = self.attn.graph_bufs``) a view
    of the attention's ``self.kv_indices``."""
    if project is None or depth > 3:
        return []
    if isinstance(container, ast.Name):
        values = fn.local_assigns.get(container.id, [])
        if len(values) != 1 or container.id in fn.params:
            return []
        container = values[0]
    aliased: list[Key] = []
    if isinstance(container, ast.Dict):
        found: list[tuple[ast.expr, FunctionInfo]] = [
            (v, fn) for k, v in zip(container.keys, container.values, strict=False) if _key_is(k, key)
        ]
    elif isinstance(container, ast.Attribute):
        is_self = isinstance(container.value, ast.Name) and container.value.id == "self"
        cls = owner(fn).cls if is_self else (typer(container.value, fn) if typer is not None else None)
        subclasses = is_self or _declared(container.value, fn, project)  # self in a base method, or a declared one
        stores = [  # a subclass's dict too: an object of a subclass holds it
            (d, where)
            for c in ([*with_bases(cls), *(descendants(cls) if subclasses else [])] if cls is not None else [])
            for d, where in c.attr_assigns.get(container.attr, [])
        ]
        found = [
            (v, where)
            for d, where in stores
            if isinstance(d, ast.Dict)
            for k, v in zip(d.keys, d.values, strict=False)
            if _key_is(k, key)
        ]
        aliases = [(d, where) for d, where in stores if isinstance(d, ast.Attribute)]
        for d, where in aliases[:4] if depth < 2 else []:  # self.page_bufs = self.attn_backend.graph_bufs
            aliased.extend(_dict_item_keys(d, key, where, depth + 1, project, typer))
    else:
        return []
    return [k for v, where in found for k in storage_keys(v, where, depth + 1, project, typer)] + aliased


def _key_is(node: ast.expr | None, key: object) -> bool:
    return isinstance(node, ast.Constant) and node.value == key


def _kept_at(name: str, fn: FunctionInfo, depth: int, project: Project | None, typer: Typer | None) -> list[Key]:
    """Keys of the lasting places `fn` stores the local `name` in: ``self.buf = name``, a dict literal holding it
    under a string key stored there (``self.cuda_graphs[bs] = {"block_tables_ptr": name, ...}``), or a list it is
    appended to (``self.kv_indptr.append(name)``)."""
    keys: list[Key] = []

    def holds(v: ast.expr | None) -> bool:  # name itself, or an item of a list or tuple literal
        elts = v.elts if isinstance(v, ast.List | ast.Tuple) else [v]
        return any(isinstance(e, ast.Name) and e.id == name for e in elts)

    for a in fn.assigns:
        if isinstance(a, ast.AugAssign) and not isinstance(a.target, ast.Name) and holds(a.value):
            keys.extend(storage_keys(a.target, fn, depth + 1, project, typer))  # self.kv_indptr += [name]
        if not isinstance(a, ast.Assign):
            continue
        suffix: str | None = None
        if isinstance(a.value, ast.Name) and a.value.id == name:  # (a tuple's items would lose their positions)
            suffix = ""
        elif isinstance(a.value, ast.Dict):
            held = [
                k
                for k, v in zip(a.value.keys, a.value.values, strict=False)
                if isinstance(v, ast.Name) and v.id == name
            ]
            if held and isinstance(held[0], ast.Constant) and isinstance(held[0].value, str):
                suffix = f"[{held[0].value!r}]"
        if suffix is None:
            continue
        for t in a.targets:
            if not isinstance(t, ast.Name):  # a lasting place: an attribute, or an item of one
                keys.extend((k0, k1, k2 + suffix) for k0, k1, k2 in storage_keys(t, fn, depth + 1, project, typer))
    for call in fn.calls:  # self.kv_indptr.append(name), .extend([name]): an item of a lasting list
        f, last = call.func, call.args[-1] if call.args else None
        if not isinstance(f, ast.Attribute) or f.attr not in ("append", "insert", "extend"):
            continue
        literal = isinstance(last, ast.List | ast.Tuple)
        if not isinstance(f.value, ast.Name) and holds(last) and literal == (f.attr == "extend"):
            keys.extend(storage_keys(f.value, fn, depth + 1, project, typer))
    return keys


def _string_item(node: ast.expr) -> bool:
    """``d["key"]``: an item of a dict under a constant string key (a buffer kept by name)."""
    return (
        isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)
    )


def param_storage_keys(
    value: ast.expr, fn: FunctionInfo, depth: int, project: Project, typer: Typer | None
) -> list[Key]:
    """Keys of the storage a parameter (or a view of one) holds: the arguments the project's callers pass."""
    root = storage_root(value)
    if not isinstance(root, ast.Name) or root.id not in fn.params:
        return []
    if root.id in fn.local_assigns and not defaulted_param(root.id, fn):
        return []
    keys: list[Key] = []
    for caller, call in project.callers(fn)[:8]:
        arg = arg_for_param(call, fn, root.id)
        if arg is not None:
            found = storage_keys(arg, caller, depth + 1, project, typer)
            if not found and depth < 3:  # the caller forwards a parameter of its own: its callers' arguments
                found = param_storage_keys(arg, caller, depth + 1, project, typer)
            keys.extend(found)
    return keys


def defaulted_param(name: str, fn: FunctionInfo) -> bool:
    """Whether every assignment to parameter `name` in `fn` is the default of an optional one (``if buf is None:
    buf = torch.zeros(...)``, ``buf = buf if buf is not None else torch.zeros(...)``, ``buf = buf or ...``, also
    annotated or as a walrus): the name then holds what callers pass, or that default."""
    guarded: list[tuple[int, int]] = []
    kept: set[int] = set()  # the name stores of buf = buf if buf is not None else d / buf = buf or d
    stores: list[ast.Name] = []
    for node in ast.walk(fn.node):
        if isinstance(node, ast.If) and _is_none_test(node.test, name, ast.Is):
            guarded.append((node.body[0].lineno, node.body[-1].end_lineno or node.body[-1].lineno))
        elif isinstance(node, ast.Assign) and _keeps_param(node.value, name):
            kept.update(id(t) for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign | ast.NamedExpr) and node.value and _keeps_param(node.value, name):
            kept.add(id(node.target))  # buf: Tensor = buf if buf is not None else d; (buf := buf or d)
        elif isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store):
            stores.append(node)
    in_guard = [id(n) in kept or any(s <= n.lineno <= e for s, e in guarded) for n in stores]
    return bool(stores) and all(in_guard)


def _is_none_test(test: ast.expr, name: str, op: type[ast.cmpop]) -> bool:
    """``name is None`` (`op` ``ast.Is``) or ``name is not None`` (``ast.IsNot``)."""
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == name
        and isinstance(test.ops[0], op)
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value is None
    )


def _keeps_param(value: ast.expr, name: str) -> bool:
    """``name if name is not None else d``, ``d if name is None else name``, ``name or d``: the parameter or a
    default."""
    if isinstance(value, ast.IfExp):
        kept = value.body if _is_none_test(value.test, name, ast.IsNot) else None
        kept = value.orelse if _is_none_test(value.test, name, ast.Is) else kept
        return isinstance(kept, ast.Name) and kept.id == name
    first = value.values[0] if isinstance(value, ast.BoolOp) and isinstance(value.op, ast.Or) else None
    return isinstance(first, ast.Name) and first.id == name


def _declared(obj: ast.expr, fn: FunctionInfo, project: Project) -> bool:
    """Whether the object `obj` names is known by its declared class only, not seen built as one class."""
    return not project.built_as_one(obj, fn)


def _attr_keys(
    cls: ClassInfo, attr: str, depth: int, project: Project, typer: Typer | None, declared: bool = False
) -> list[Key]:
    """Keys of ``obj.attr`` on an instance of `cls`: its ``self.attr``, or what a ``@property`` of that name
    returns (``metadata.kv_indptr`` returning ``self._kv_indptr``); where the object is `declared` with `cls` (not
    seen built) and only subclasses of `cls` store `attr` (an abstract backend's buffers), the object is one of
    theirs: their ``self.attr``."""
    keys = _property_keys(cls, attr, depth, project, typer)
    family = with_bases(cls)
    if declared and not any(attr in c.attr_assigns or attr in c.fields for c in family):
        family = family + descendants(cls)
    own: list[Key] = [("self", c.qualname, f"self.{attr}") for c in family]
    own += _alias_keys(cls, attr, depth, project, typer) if depth < 3 else []
    return keys or own + _field_keys(cls, attr, depth, project, typer) + _late_keys(cls, attr, depth, project, typer)


def _alias_keys(cls: ClassInfo, attr: str, depth: int, project: Project, typer: Typer | None) -> list[Key]:
    """Keys of what ``self.attr`` aliases in `cls` and its bases: another object's buffer (``self.kv_indptr =
    backend.kv_indptr``) or what the constructor's callers pass (``self.kv_indptr = kv_indptr_row``: a row of
    theirs)."""
    keys: list[Key] = []
    for c in with_bases(cls):
        for v, where in c.attr_assigns.get(attr, []):
            if isinstance(v, ast.Attribute) and not _is_allocation(v):
                keys.extend(storage_keys(v, where, depth + 1, project, typer))
            else:
                keys.extend(param_storage_keys(v, where, depth, project, typer))
    return keys


def _late_keys(cls: ClassInfo, attr: str, depth: int, project: Project, typer: Typer | None) -> list[Key]:
    """Keys of what the project stores into `attr` of an instance of `cls` after building it (``fb.kv_indices =
    self.kv_indices`` on a ``ForwardBatch`` the backend was handed)."""
    if depth > 2 or typer is None:
        return []
    keys: list[Key] = []
    serving = not cls.module.source.is_tooling
    for value, where in project.attr_stores.get(attr, [])[:32]:
        if serving and where.source.is_tooling:
            continue  # a test's store says nothing of what the engine's objects hold
        for a in where.assigns:
            if a.value is value and isinstance(a, ast.Assign):
                receivers = [t.value for t in a.targets if isinstance(t, ast.Attribute) and t.attr == attr]
                if any(typer(r, where) is cls for r in receivers):
                    keys.extend(storage_keys(value, where, depth + 1, project, typer))
    return keys


def _field_keys(cls: ClassInfo, attr: str, depth: int, project: Project, typer: Typer | None) -> list[Key]:
    """Keys of the storage that the project's constructor calls of `cls` pass for its field `attr`
    (``FlashInferMetadata(paged_kv_indptr=self.paged_kv_indptr[: bs + 1])``: the builder's buffer), also in copies
    (``meta._replace(kv_indptr=...)`` of a NamedTuple, ``dataclasses.replace(meta, kv_indptr=...)``)."""
    fields = field_order(cls)
    if depth > 2 or attr not in fields:
        return []
    keys: list[Key] = []
    for caller, call in project.calls_by_name().get(cls.name, [])[:32]:
        if project.resolve_def(call.func, caller) is not cls:
            continue
        arg = kwarg(call, attr)
        if arg is None and fields.index(attr) < len(call.args):
            arg = call.args[fields.index(attr)]
        if arg is not None:
            keys.extend(storage_keys(arg, caller, depth + 1, project, typer))
    by_name = project.calls_by_name()
    copies = [  # meta._replace(kv_indptr=self.kv_indptr[: n]), dataclasses.replace(meta, ...): not str.replace
        (caller, call, copy[0])
        for name in ("_replace", "replace", "evolve")
        for caller, call in by_name.get(name, [])
        if (copy := copied(call, caller, typer)) is not None
    ]
    for caller, call, source in copies[:32]:
        arg = kwarg(call, attr)
        if arg is not None and typer is not None and cls in with_bases(typer(source, caller)):
            keys.extend(storage_keys(arg, caller, depth + 1, project, typer))
    return keys


def _property_keys(cls: ClassInfo, attr: str, depth: int, project: Project, typer: Typer | None) -> list[Key]:
    prop = project.method(cls, attr)
    if prop is None or depth > 3 or not any(dotted(d) in PROPERTIES for d in prop.decorators):
        return []
    return [k for r in prop.returns for k in storage_keys(r, prop, depth + 1, project, typer)]


def arg_for_param(call: ast.Call, callee: FunctionInfo, param: str) -> ast.expr | None:
    """The argument expression `call` passes for `callee`'s parameter `param` (None if not passed or unknown)."""
    for kw in call.keywords:
        if kw.arg == param:
            return kw.value
    node = callee.node
    if isinstance(node, ast.Module):
        return None
    positional = [a.arg for a in [*node.args.posonlyargs, *node.args.args]]
    decorators = {dotted(d) for d in node.decorator_list}
    bound = callee.cls is not None and "staticmethod" not in decorators
    # map(partial(_pages_for, page_size=ps), lens) runs _pages_for(<a len>, page_size=ps)
    handed = handoff_arguments(call, param, positional[1:] if bound else positional)
    if handed is not None:
        return handed
    called_object = callee.name in ("__call__", "forward")  # layer(h, ...) or self.heads[k](x): self is the object
    on_object = isinstance(call.func, ast.Attribute) or callee.name == "__init__" or callee.name in POST_INITS
    on_object = on_object or called_object
    if bound and on_object and ("classmethod" in decorators or not through_class(call, callee)):
        positional = positional[1:]
    positional = positional[ctx_shift(call, callee) :]  # Fn.apply(q, k) fills forward(ctx, q, k) after ctx
    if callee.cls is not None and callee.name in POST_INITS and terminal_name(call.func) != callee.name:
        positional = field_order(callee.cls)  # Meta(lens, kv_indptr) builds it: an InitVar is at its field's place
    if param not in positional:
        return None
    i = positional.index(param)
    args = positional_args(call)
    if i < len(args) and not any(isinstance(a, ast.Starred) for a in args[: i + 1]):
        return args[i]
    return None


def _is_allocation(v: ast.expr) -> bool:
    return isinstance(v, ast.Call)


_FIELD_FUNCS = frozenset({"field", "dataclasses.field", "attr.ib", "attrs.field", "attr.field", "Field"})


def allocations(
    expr: ast.expr,
    fn: FunctionInfo,
    depth: int = 0,
    project: Project | None = None,
    attr_values: AttrValues | None = None,
) -> list[tuple[ast.Call, FunctionInfo]]:
    """The ``torch.<factory>(...)`` calls whose storage `expr` may be (through aliases, views, attributes of
    ``self`` and of other objects of known type, parameters filled by the project's callers, project factories and
    caches). `attr_values` gives the values an attribute of a class may hold (default: what the class and its bases
    assign; the provenance's answer adds stores through other objects, ``meta.ws = self._get_ws()``)."""
    if depth > 5:
        return []

    def again(e: ast.expr, where: FunctionInfo) -> list[tuple[ast.Call, FunctionInfo]]:
        return allocations(e, where, depth + 1, project, attr_values)

    root = storage_root(expr)
    if isinstance(root, ast.IfExp | ast.BoolOp):  # ws if ws is not None else torch.empty(...), cached or torch.empty
        branches = [root.body, root.orelse] if isinstance(root, ast.IfExp) else root.values
        return [a for b in branches for a in again(b, fn)]
    if isinstance(root, ast.ListComp):  # [torch.zeros(128 << 20, ...) for _ in range(m)], read as ws[i]
        return again(root.elt, fn)
    if isinstance(root, ast.DictComp):  # {g: torch.empty(n, ...) for g in groups}, read as ws[g]
        return again(root.value, fn)
    if isinstance(root, ast.Dict | ast.List | ast.Tuple):  # {"full": torch.empty(...), ...}, read as ws[key]
        return [a for item in literal_items(root)[:16] for a in again(item, fn)]
    if isinstance(root, ast.Call):
        name = torch_name(root.func, fn) or ""
        if name.startswith("torch.") and name.rsplit(".", 1)[-1] in ALLOCATORS:
            return [(root, fn)]
        factory = kwarg(root, "default_factory") if dotted(root.func) in _FIELD_FUNCS else None
        if isinstance(factory, ast.Lambda):  # a dataclass field: field(default_factory=lambda: torch.empty(...))
            return again(factory.body, fn)
        if isinstance(root.func, ast.Attribute) and root.func.attr.startswith("new_"):
            return [(root, fn)]
        if project is not None and isinstance(root.func, ast.Name | ast.Attribute):
            target = project.resolve_def(root.func, fn)
            if isinstance(target, FunctionInfo):  # a factory: what it (or each @target.register function) returns
                made = [target, *project.dispatch_impls(target)]
                on_self = isinstance(root.func, ast.Attribute) and dotted(root.func.value) == "self"
                if target.cls is not None and on_self:
                    made += project.overrides(target.cls, target.name)  # self.allocate(n): each subclass's
                return [a for t in made for r in t.returns for a in again(r, t)]
        return []
    if isinstance(root, ast.Name):
        name = root.id
        if project is not None and name in fn.params and name not in fn.local_assigns and name not in ("self", "cls"):
            return [  # a workspace handed in by the project's callers
                a
                for caller, call in project.callers(fn)[:16]
                if (arg := arg_for_param(call, fn, name)) is not None
                for a in again(arg, caller)
            ]
        local = fn.local_assigns.get(name)
        if local is None and name in fn.loop_vars:  # for ws in (fresh, zeroed): each item of what the loop walks
            return [a for c in fn.loop_vars[name][:4] for a in again(c, fn)]
        outer = fn.parent if local is None and name not in fn.params else None
        while outer is not None and name not in outer.local_assigns and name not in outer.params:
            outer = outer.parent
        if outer is not None:  # a closure's free variable (ws = scratch(...) around def attend(...)): that binding
            return again(root, outer)
        values = [(v, fn) for v in local] if local is not None else []
        if local is None and fn is not fn.module.body:  # a module global, also one a function sets (global X)
            values = fn.module.global_values(name)
        found = [a for v, scope in values for a in again(v, scope)]
        if project is not None and values and all(isinstance(v, ast.Dict | ast.List) for v, _ in values):
            # a cache: _CACHE[key] = torch.empty(...) in any function of the module
            found.extend(
                a
                for f in project.by_module.get(fn.module.name, [])
                for v in f.item_stores.get(name, [])
                for a in again(v, f)
            )
        return found
    if isinstance(root, ast.Subscript) and isinstance(root.slice, ast.Constant):  # ws["fp8"]: that key's item
        key, container = root.slice.value, root.value
        stored = _keyed_stores(root, fn, project)  # self.ws["trtllm"] = torch.zeros(...): also what that key holds
        held = _attr_values(container, fn, project, attr_values) if isinstance(container, ast.Attribute) else []
        if isinstance(container, ast.Name):
            held = [(v, fn) for v in fn.local_assigns.get(container.id, [])] or fn.module.global_values(container.id)
            cache = container.id not in fn.local_assigns and container.id not in fn.params
            if project is not None and cache and held and all(isinstance(v, ast.Dict) for v, _ in held):
                stored = [*stored, *_cache_stores(container.id, key, project.by_module.get(fn.module.name, []))]
        items = [(item, where) for v, where in held for item in _under_key(v, key, named_only=bool(stored))]
        return [a for v, where in [*items, *stored] for a in again(v, where)]
    if isinstance(root, ast.Attribute):
        return [a for v, where in _attr_values(root, fn, project, attr_values) for a in again(v, where)]
    return []


Held = tuple[ast.expr, FunctionInfo]


def _attr_values(
    attr: ast.Attribute, fn: FunctionInfo, project: Project | None, attr_values: AttrValues | None
) -> list[tuple[ast.expr, FunctionInfo]]:
    """What ``self.x`` or another object's ``obj.x`` (of a known type) may be bound to."""
    classes = _owner_classes(
        attr.value, fn, project
    )  # self, or another object (self.backend.ws, pool.ws) of known type
    if attr_values is not None:
        return [vw for cls in classes for vw in attr_values(cls, attr.attr)]
    return [vw for cls in classes for c in with_bases(cls) for vw in c.attr_assigns.get(attr.attr, [])]


def _owner_classes(obj: ast.expr, fn: FunctionInfo, project: Project | None) -> list[ClassInfo]:
    """The classes an object may be of: the class of ``self``, every class callers pass for a parameter, else the
    one the project's typing finds."""
    if isinstance(obj, ast.Name) and obj.id == "self":
        cls = owner(fn).cls
        return [cls] if cls is not None else []
    if project is None:
        return []
    if isinstance(obj, ast.Name) and obj.id in fn.params and obj.id not in fn.local_assigns:
        return project.param_classes(obj.id, fn)
    cls = project.instance_type(obj, fn)
    return [cls] if cls is not None else []


def _keyed_stores(
    read: ast.Subscript, fn: FunctionInfo, project: Project | None
) -> list[tuple[ast.expr, FunctionInfo]]:
    """The values stored under the string key `read` reads (``self.ws["trtllm"] = ...``), by the owner's class."""
    at = keyed_lookup(read.value, read.slice.value) if isinstance(read.slice, ast.Constant) else None
    if at is None:
        return []
    classes = _owner_classes(at[0], fn, project)
    return [vw for cls in classes for c in with_bases(cls) for k in at[1] for vw in c.item_assigns.get(k, [])]


def _under_key(value: ast.expr, key: object, *, named_only: bool = False) -> list[ast.expr]:
    """The item a dict bound to `value` holds under `key` (every item of a comprehension, or of a literal that
    does not name the key, unless `named_only`: the key is known stored elsewhere); a value that is not a dict
    literal is followed as it is."""
    if isinstance(value, ast.DictComp):
        return [value.value]
    if isinstance(value, ast.Dict):
        pairs = list(zip(value.keys, value.values, strict=True))
        named = [v for k, v in pairs if isinstance(k, ast.Constant) and k.value == key]
        unknown = [v for k, v in pairs if k is not None and not isinstance(k, ast.Constant)]  # {TRT: ...}: may be it
        return named + unknown if named or named_only else list(value.values)
    return [value]


def _cache_stores(name: str, key: object, functions: list[FunctionInfo]) -> list[Held]:
    """``name[key] = value`` in the given functions (a module cache: ``_CACHE["verify"] = torch.empty(...)``), also
    stores under a key that is not a constant (it may be `key`); stores under another constant key are not."""
    out: list[Held] = []
    for f in functions:
        for a in f.assigns if name in f.item_stores else ():
            if not isinstance(a, ast.Assign):
                continue
            for t in a.targets:
                if not (isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id == name):
                    continue
                if not isinstance(t.slice, ast.Constant) or t.slice.value == key:
                    out.append((a.value, f))
    return out
