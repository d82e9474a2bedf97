"""FC107 realloc-on-replay-path: a persistent buffer is reallocated on a per-step or replay path."""

from __future__ import annotations

import ast

from flashcheck.verifier.astutil import annotation, dotted, literal_items, own_nodes, terminal_name
from flashcheck.verifier.dataflow import ALLOCATORS
from flashcheck.verifier.engine import Context, Rule, rule
from flashcheck.verifier.guards import bind_count
from flashcheck.verifier.hotpath import Hop, HotPaths
from flashcheck.verifier.index import owner_of, with_bases
from flashcheck.verifier.operator_idioms import as_written
from flashcheck.verifier.project import FunctionInfo, torch_name
from flashcheck.verifier.provenance import Where
from flashcheck.verifier.provenance.calls import NAMESPACES, namespace_owner
from flashcheck.verifier.rules.fc101_host_sync import snippet

_COPIES = frozenset({"clone", "cat", "stack", "new_empty", "new_zeros", "new_ones", "new_full", "new_tensor"})


@rule("FC107", "realloc-on-replay-path")
class ReallocOnReplayPath(Rule):
    """A persistent buffer (``self.<attr>``) is reallocated on a path that runs every step or before replay.

    What it checks
        In functions reachable from a per-step root (replay preparation, metadata build, plan wrappers, configured hot
        paths; not capture), assignments of a fresh tensor (``torch.empty``/``zeros``/``full``/..., ``.clone()``,
        ``torch.cat``, ``x.new_*``) to ``self.<attr>``, ``self.<attr>["key"]``, any item of an attribute built as a list
        or dict of device buffers (``self.kv_indices[g] = torch.empty(...)``, ``self.static_inputs[name] =
        torch.empty_like(x)``; also a list a constructor or a setup method no per-step root runs (by its name:
        ``init*``, ``setup*``, ``alloc*``, ``create*``, ``build*``; ``init_cuda_graph_state``) fills by
        ``self.bufs.append(torch.zeros(...))``; not a list of ``None`` slots or an empty dict or list filled as it goes)
        a module's global (a name the function declares ``global``, ``mod.name`` of a project module imported as a
        namespace: ``S.input_ids = torch.cat(...)``), an attribute of an object ``self`` keeps
        (``self.backend.kv_indptr``, also through a local bound to it, ``mr = self.model_runner``, or to what a weak
        reference it keeps refers to, ``bufs = self._bufs_ref()``) or of an object that holds a captured
        ``torch.cuda.CUDAGraph`` (a runner's record per size, however it is fetched: ``entry = self.graphs.get(bs);
        entry.positions = x.clone()``; also a record whose constructor keeps a parameter so annotated, ``def
        __init__(self, graph: torch.cuda.CUDAGraph, ...): self.graph = graph``, and a ``SimpleNamespace(graph=g,
        output=logits)`` record; also a field set by ``entry.__dict__.update(output=...)``), also through
        ``setattr(self, name, ...)`` with a literal name or the constants a loop gives it (``for name in
        self._STATIC_INPUTS: setattr(self, name, getattr(fb, name).clone())``), and
        ``.resize_()`` of such a buffer (also an item, ``self.seq_lens[dev].resize_(n)``). A lazy first allocation
        guarded by ``if self.<attr> is None:`` (or ``not hasattr``, ``getattr(self, "x", None) is None``,
        ``(x := self.x) is None``, also through a local bound to the attribute) is not reported, nor are the buffers
        its block allocates beside it, when the block sets the attribute the test asks about (``if params.top_k is
        None: self.top_k = torch.full(...)`` is reported), but a guard that also lets growth through (``if self.x is
        None or self.x.numel() < n:``) is; the same holds for
        conditional expressions (``torch.zeros(n) if self.x is None else self.x`` and ``self.x or torch.zeros(n)`` are
        lazy, ``torch.empty(n) if n > self.cap else self.x`` grows); nor is ``__init__`` of an object built per step,
        nor a host-only buffer (``device="cpu"``, pinned, no device, ``*_cpu``/``*_host`` names, or a ``torch.cat`` of
        host buffers), which no captured graph reads.

    Why it breaks serving
        A captured CUDA graph holds the addresses of the buffers it read during capture. Rebinding the attribute
        leaves the graph reading the old storage: the replay computes from stale metadata while the new buffer is
        filled and ignored. rtp-llm had to add a ``forbid_realloc`` guard on its replay path for exactly this. In
        eager mode it also allocates every step.

    Example
        ::

            def init_forward_metadata_replay_cuda_graph(self, bs, seq_lens, ...):
                self.kv_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)   # FC107

    Use instead
        Allocate for the largest batch at start-up (or capture time) and write into a slice
        (``self.kv_indptr[: bs + 1].copy_(...)``); if a size can grow, grow it before capture and fail loudly
        on the replay path.

    Known false positives
        An attribute that is not a graph input (a per-step Python object stored on ``self``) is reported if it is a
        new tensor; suppress with a reason. Growth guarded by a size check is reported on purpose, and so is the
        one-time replacement of a placeholder on the first step (``if self.scale.numel() == 1: self.scale =
        torch.ones(...)``, before any graph is captured): the analysis does not know the first step comes first.

    What it cannot see
        Rebinding of a per-step object's attribute (``meta.buf = torch.zeros(...)`` on an object built or passed in per
        step is allowed), ``setattr`` with a name computed at run time (not a constant), and reallocations inside code
        that no configured or default root reaches. Code in a branch that every path to its function rules out with a
        constant argument (``if not skip_eplb:`` when every call passes ``skip_eplb=True``; ``docs/static.md``) is not
        checked.
    """

    def check(self, ctx: Context) -> None:
        step = ctx.hot.reach("step")
        setup = {id(f) for f in ctx.hot.reach("capture")}  # appends there build a list, as a constructor's do
        for fn in step:
            if fn.name in ("__init__", "__post_init__"):
                continue
            guarded = _lazy_init_assigns(fn)
            for a in fn.assigns:
                if (
                    isinstance(a, ast.AugAssign)
                    or a.value is None
                    or id(a) in guarded
                    or not ctx.hot.live(fn, a, "step")
                ):
                    continue
                if not _is_fresh_tensor(a.value, fn):
                    continue
                if ctx.prov.of(a.value, fn) is Where.HOST:
                    continue  # a host-only buffer: no captured graph reads it
                for t in a.targets if isinstance(a, ast.Assign) else [a.target]:
                    if (
                        _is_self_buffer(t, fn)
                        or _is_container_item(t, fn, ctx, step, setup)
                        or _is_graph_record_field(t, fn, ctx)
                        or _is_module_global(t, fn, ctx)
                    ):
                        self._hit(ctx, fn, a, step, f"rebinds `{as_written(t)}` to `{snippet(a.value, 50)}`")
            for call in fn.calls:
                if (
                    isinstance(call.func, ast.Attribute)
                    and call.func.attr == "resize_"
                    and (
                        _is_self_buffer(call.func.value, fn)
                        or _is_container_item(call.func.value, fn, ctx, step, setup)  # self.lens[dev].resize_(n)
                    )
                    and ctx.prov.of(call.func.value, fn) is not Where.HOST  # a host mirror: no graph reads it
                ):
                    self._hit(ctx, fn, call, step, f"resizes `{as_written(call.func.value)}` in place")
                elif (updated := _namespace_update(call)) is not None and id(call) not in guarded:
                    owner, fields = updated
                    for attr, value in fields:  # entry.__dict__.update(output=torch.empty_like(out))
                        target = ast.copy_location(ast.Attribute(owner, attr, ast.Load()), call)
                        if not _is_fresh_tensor(value, fn) or ctx.prov.of(value, fn) is Where.HOST:
                            continue
                        if _is_self_buffer(target, fn) or _is_graph_record_field(target, fn, ctx):
                            self._hit(ctx, fn, call, step, f"rebinds `{as_written(target)}` to `{snippet(value, 50)}`")
                elif _setattr_on_self(call) and id(call) not in guarded:  # setattr(self, "buf", torch.zeros(n))
                    value = call.args[2]
                    if _is_fresh_tensor(value, fn) and ctx.prov.of(value, fn) is not Where.HOST:
                        # the name: a literal, or the constants the value flow gives it (a loop over a class tuple)
                        names = ctx.prov.flow.attribute_names(call.args[1], fn, call.lineno)
                        if names:
                            what = "/".join(names[:3]) + ("/..." if len(names) > 3 else "")
                            self._hit(ctx, fn, call, step, f"rebinds `self.{what}` to `{snippet(value, 50)}` (setattr)")

    def _hit(self, ctx: Context, fn: FunctionInfo, node: ast.AST, reach: dict[FunctionInfo, Hop], what: str) -> None:
        root = reach[fn].root
        ctx.report(
            self,
            fn,
            node,
            f"{fn.short} {what} on a per-step path (root {root.fn.short}); a captured graph keeps reading "
            "the old storage",
            hint="allocate for the largest batch once and write into a slice; grow only before capture",
            chain=HotPaths.chain(fn, reach),
            evidence={"root": root.fn.qualname},
        )


def _is_fresh_tensor(value: ast.expr, fn: FunctionInfo) -> bool:
    """A new tensor, also as a branch of ``a if test else b`` that runs when the buffer exists (the branch taken
    only while it is missing, ``torch.zeros(n) if self.x is None else self.x``, and ``self.x or torch.zeros(n)``,
    are lazy first allocations)."""
    if isinstance(value, ast.IfExp):
        body = _is_fresh_tensor(value.body, fn) and not _is_lazy_test(value.test)
        return body or (_is_fresh_tensor(value.orelse, fn) and not _is_present_test(value.test))
    if isinstance(value, ast.BoolOp):
        return isinstance(value.op, ast.And) and any(_is_fresh_tensor(v, fn) for v in value.values)
    if not isinstance(value, ast.Call):
        return False
    f = value.func
    if isinstance(f, ast.Attribute) and f.attr in ("to", "cuda") and isinstance(f.value, ast.Call):
        # torch.from_numpy(a).to(dev): a host tensor made here and copied to new device storage
        made = (torch_name(f.value.func, fn) or "").rsplit(".", 1)[-1]
        return made in ("from_numpy", "tensor", "as_tensor") or _is_fresh_tensor(f.value, fn)
    name = torch_name(value.func, fn) or ""
    if name.startswith("torch."):
        last = name.rsplit(".", 1)[-1]  # `Z` after `from torch import zeros as Z` is `zeros`
        return last in ALLOCATORS or last in _COPIES
    last = terminal_name(value.func) or ""
    return isinstance(value.func, ast.Attribute) and last in _COPIES


def _is_module_global(t: ast.expr, fn: FunctionInfo, ctx: Context) -> bool:
    """A module's global: a name the function declares ``global``, or ``mod.name`` of a project module
    (``S.input_ids`` after ``from . import state as S``), also its item under a string key."""
    if isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant) and isinstance(t.slice.value, str):
        t = t.value
    if isinstance(t, ast.Name):
        return any(isinstance(n, ast.Global) and t.id in n.names for n in own_nodes(fn.node))
    return isinstance(t, ast.Attribute) and ctx.project.module_attribute(t, fn) is not None


def _is_self_buffer(t: ast.expr, fn: FunctionInfo | None = None) -> bool:
    """``self.buf``, ``self.bufs["k"]`` and attributes of objects ``self`` keeps (``self.backend.kv_indptr``), also
    through a local bound once to such an object (``mr = self.model_runner; mr.input_buffers.positions``) or to a
    weak reference's target (``bufs = self._bufs_ref()``): storage that outlives the step."""
    if isinstance(t, ast.Subscript):
        if not (isinstance(t.slice, ast.Constant) and isinstance(t.slice.value, str)):
            return False  # self.buf[:n] = ... writes into the buffer, which is the fix
        t = t.value
    if not isinstance(t, ast.Attribute):
        return False
    return _kept_by_self(t.value, fn, 0)


def _kept_by_self(base: ast.expr, fn: FunctionInfo | None, depth: int) -> bool:
    """An object ``self`` keeps: ``self``, an attribute chain from it, the target of a weak reference it keeps
    (``self._runner_ref()``), or a local bound once to one of those."""
    while isinstance(base, ast.Attribute) or (isinstance(base, ast.Call) and _weak_deref(base, fn)):
        base = base.value if isinstance(base, ast.Attribute) else base.func
    if not isinstance(base, ast.Name):
        return False
    if base.id == "self":
        return True
    values = fn.local_assigns.get(base.id, []) if fn is not None and base.id not in fn.params else []
    once = fn is not None and len(values) == 1 and bind_count(fn, base.id) == 1  # not also a loop or with target
    return once and depth < 3 and _kept_by_self(values[0], fn, depth + 1)


def _weak_deref(call: ast.Call, fn: FunctionInfo | None) -> bool:
    """``self._runner_ref()``: calling a weak reference that ``self`` keeps (an attribute bound to
    ``weakref.ref(...)``) gives back the object it refers to; any other call may make a new object."""
    f = call.func
    if (
        call.args
        or call.keywords
        or fn is None
        or not isinstance(f, ast.Attribute)
        or not isinstance(f.value, ast.Name)
    ):
        return False
    cls = owner_of(fn).cls if f.value.id == "self" else None
    stores = [v for c in with_bases(cls) for v, _ in c.attr_assigns.get(f.attr, [])] if cls is not None else []
    return bool(stores) and all(isinstance(v, ast.Call) and dotted(v.func) in _WEAK_REFS for v in stores)


_WEAK_REFS = frozenset({"weakref.ref", "ref", "weakref.WeakMethod", "WeakMethod"})


def _is_graph_record_field(t: ast.expr, fn: FunctionInfo, ctx: Context) -> bool:
    """``entry.positions = ...`` on an object that holds a captured CUDA graph (an attribute or field declared or
    built as ``torch.cuda.CUDAGraph``, as the records a runner keeps per batch size): its tensors are the graph's
    static inputs and outputs, so rebinding one leaves the graph reading the old storage."""
    if not isinstance(t, ast.Attribute) or not isinstance(t.value, ast.Name) or t.value.id in ("self", "cls"):
        return False
    cls = ctx.project.instance_type(t.value, fn)
    if cls is None and _namespace_holds_graph(t.value, fn, ctx):  # SimpleNamespace(graph=g, output=logits)
        return True
    for c in with_bases(cls):
        body = c.module.body
        if body is None:
            continue
        if any(_names_cuda_graph(ann) for ann in c.attr_types.values()):
            return True
        for values in c.attr_assigns.values():
            for v, where in values:
                if isinstance(v, ast.Call) and (torch_name(v.func, where) or "").endswith("cuda.CUDAGraph"):
                    return True
                if isinstance(v, ast.Name) and _names_cuda_graph(where.params.get(v.id)):
                    return True  # def __init__(self, graph: torch.cuda.CUDAGraph, ...): self.graph = graph
    return False


def _namespace_holds_graph(obj: ast.expr, fn: FunctionInfo, ctx: Context) -> bool:
    """`obj` may be a ``SimpleNamespace`` record built with a captured graph among its fields (``graph=g`` after
    ``g = torch.cuda.CUDAGraph()``), followed a few steps back through names, items and containers."""
    flow = ctx.prov.flow
    stack, seen = [(obj, fn)], 0
    while stack and seen < 16:
        v, where = stack.pop()
        seen += 1
        if isinstance(v, ast.Call) and (dotted(v.func) or "") in NAMESPACES:
            graphs = [k.value for k in v.keywords if k.arg and _builds_graph(k.value, where)]
            if graphs:
                return True
            continue
        stack.extend(flow.sources(v, where)[:8] if isinstance(v, ast.Name | ast.Subscript) else [])
        if isinstance(v, ast.Subscript):
            stack.extend(flow.element_sources(v.value, where)[:8])
    return False


def _builds_graph(value: ast.expr, fn: FunctionInfo) -> bool:
    """``torch.cuda.CUDAGraph()``, also through a local bound once to it."""
    if isinstance(value, ast.Name) and len(bound := fn.local_assigns.get(value.id, [])) == 1:
        value = bound[0]
    return isinstance(value, ast.Call) and (torch_name(value.func, fn) or "").endswith("cuda.CUDAGraph")


def _namespace_update(call: ast.Call) -> tuple[ast.expr, list[tuple[str, ast.expr]]] | None:
    """The object and the keyword fields of ``obj.__dict__.update(k=v)`` / ``vars(obj).update(k=v)``, else None."""
    f = call.func
    owner = namespace_owner(f.value) if isinstance(f, ast.Attribute) and f.attr == "update" else None
    return (owner, [(k.arg, k.value) for k in call.keywords if k.arg]) if owner is not None else None


def _names_cuda_graph(ann: ast.expr | None) -> bool:
    """An annotation of a CUDA graph: ``torch.cuda.CUDAGraph``, also ``Optional[...]``, ``... | None`` or a string."""
    found = annotation(ann)
    return found is not None and (dotted(found) or "").rsplit(".", 1)[-1] == "CUDAGraph"


def _is_container_item(
    t: ast.expr, fn: FunctionInfo, ctx: Context, step: dict[FunctionInfo, Hop], capture: set[int]
) -> bool:
    """``self.bufs[i] = ...`` where ``self.bufs`` (or an attribute of an object ``self`` keeps) was built as a list or
    dict of buffers: the item is rebound to new storage (a tensor attribute indexed so is written into instead).
    Appends count as building it in a constructor or in a setup method no per-step root runs
    (``init_cuda_graph_state``)."""
    if not isinstance(t, ast.Subscript) or isinstance(t.slice, ast.Slice) or not _is_self_buffer(t.value):
        return False
    if any(_holds_buffers(v, where) for v, where in ctx.prov.flow.sources(t.value, fn)):
        return True
    held = t.value
    if not isinstance(held, ast.Attribute):
        return False
    filled = [
        vw for c in with_bases(ctx.prov.flow.instance_type(held.value, fn)) for vw in c.item_assigns.get(held.attr, [])
    ]
    # appended in setup code, one buffer per bucket (self.bufs.append(torch.zeros(...))): built holding buffers
    setup = [w.name == "__init__" or (w not in step and (id(w) in capture or _setup_name(w.name))) for _, w in filled]
    built = [(v, w) for (v, w), s in zip(filled, setup, strict=True) if s]
    return bool(built) and all(_is_fresh_tensor(v, w) for v, w in built)


def _setup_name(name: str) -> bool:
    """A one-time setup method by its name (``init_cuda_graph_state``, ``_setup_buffers``, ``allocate_graph_bufs``,
    ``reserve_buffers``, ``warmup``), not a handler that runs per request (``add_request``, ``create_request``)."""
    return name.lstrip("_").startswith(("init", "setup", "alloc", "reserve", "warmup"))


def _holds_buffers(v: ast.expr, fn: FunctionInfo) -> bool:
    """A list or dict built holding device buffers (a literal or comprehension of allocations): the buffers a graph
    may have been captured with. An empty one filled as it goes (per-request state, a cache of ``None`` slots) is
    not."""
    if isinstance(v, ast.ListComp | ast.DictComp):
        items = [v.elt if isinstance(v, ast.ListComp) else v.value]
    elif isinstance(v, ast.List | ast.Dict):
        items = literal_items(v)
    else:
        return False
    return bool(items) and all(_is_fresh_tensor(e, fn) for e in items)


def _setattr_on_self(call: ast.Call) -> bool:
    """``setattr(self, name, value)`` (or on an object ``self`` keeps)."""
    return (
        isinstance(call.func, ast.Name)
        and call.func.id == "setattr"
        and len(call.args) == 3
        and ((isinstance(call.args[0], ast.Name) and call.args[0].id == "self") or _is_self_buffer(call.args[0]))
    )


def _lazy_init_assigns(fn: FunctionInfo) -> set[int]:
    """Assignments (and ``setattr`` calls) inside ``if self.x is None:`` / ``if not hasattr(self, "x"):`` blocks that
    set what the test asks about (``self.x`` or an item of it, also through a local bound to it), with the buffers
    allocated beside it: a block that sets nothing the test asks about (``if params.top_k is None: self.top_k =
    torch.full(...)``) guards a per-step choice, not a first allocation."""
    out: set[int] = set()
    if isinstance(fn.node, ast.Module):
        return out
    for node in ast.walk(fn.node):
        if isinstance(node, ast.If) and _is_lazy_test(node.test):
            subjects = {_through_local(x, fn) for x in _lazy_subjects(node.test)}
            sets = [
                n
                for inner in node.body
                for n in ast.walk(inner)
                if isinstance(n, ast.Assign | ast.AnnAssign | ast.Call)
            ]
            if any(_sets_subject(n, subjects) for n in sets):  # the block makes what it tests for, and its siblings
                out.update(id(n) for n in sets)
    return out


def _lazy_subjects(test: ast.expr) -> set[str]:
    """What a lazy test asks about: ``self.x`` for ``self.x is None`` and ``not hasattr(self, "x")``."""
    if isinstance(test, ast.BoolOp):
        return {s for v in test.values for s in _lazy_subjects(v)}
    if isinstance(test, ast.Compare):
        left = test.left  # getattr(self, "x", None) is None asks about self.x
        if isinstance(left, ast.Call) and dotted(left.func) == "getattr" and len(left.args) >= 2:
            return {_attr_key(left.args[0], left.args[1])}
        if isinstance(left, ast.NamedExpr):  # (arange := self._arange) is None asks about self._arange
            return {ast.unparse(left.value), left.target.id}
        return {ast.unparse(left)}
    if isinstance(test, ast.UnaryOp) and isinstance(test.operand, ast.Call):
        args = test.operand.args
        if len(args) == 2:
            return {_attr_key(args[0], args[1])}
    return set()


def _attr_key(obj: ast.expr, name: ast.expr) -> str:
    """``self.x`` for ``(self, "x")``; ``self.{name}`` for a name computed in a variable (a loop's), which the
    test and the ``setattr`` of a lazy block share."""
    if isinstance(name, ast.Constant) and isinstance(name.value, str):
        return f"{ast.unparse(obj)}.{name.value}"
    return f"{ast.unparse(obj)}.{{{ast.unparse(name)}}}"


def _sets_subject(node: ast.AST, subjects: set[str]) -> bool:
    """Whether an assignment (or ``setattr``) inside a lazy test's block sets what the test asks about."""
    if isinstance(node, ast.Call):  # setattr(self, "x", ...)
        if not _setattr_on_self(node):
            return False
        targets = [_attr_key(node.args[0], node.args[1])]
    elif isinstance(node, ast.Assign):
        targets = [ast.unparse(t) for t in node.targets]
    elif isinstance(node, ast.AnnAssign):
        targets = [ast.unparse(node.target)]
    else:
        return False
    return any(t == s or t.startswith((s + "[", s + ".")) for t in targets for s in subjects)


def _through_local(subject: str, fn: FunctionInfo) -> str:
    """A tested local bound once to an attribute (``buf = self.buf; if buf is None:``) stands for that attribute."""
    values = fn.local_assigns.get(subject, [])
    if len(values) == 1 and subject not in fn.params and isinstance(values[0], ast.Attribute | ast.Subscript):
        return ast.unparse(values[0])
    return subject


def _is_present_test(test: ast.expr) -> bool:
    """A test that holds once the buffer exists: ``x is not None``, ``hasattr(self, "x")``."""
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.IsNot):
        c = test.comparators[0]
        return isinstance(c, ast.Constant) and c.value is None
    return isinstance(test, ast.Call) and dotted(test.func) == "hasattr"


def _is_lazy_test(test: ast.expr) -> bool:
    """A test that holds only while the buffer does not exist yet: ``x is None``, ``not hasattr(...)``, and those
    joined by ``and`` (any of them) or ``or`` (all of them; ``x is None or x.numel() < n`` also grows)."""
    if isinstance(test, ast.BoolOp):
        if isinstance(test.op, ast.Or):
            return all(_is_lazy_test(v) for v in test.values)
        return any(_is_lazy_test(v) for v in test.values)
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Is):
        c = test.comparators[0]
        return isinstance(c, ast.Constant) and c.value is None
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = test.operand
        return isinstance(inner, ast.Call) and dotted(inner.func) == "hasattr"
    return False
