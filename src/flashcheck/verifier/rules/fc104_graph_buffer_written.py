"""FC104 graph-buffer-written-elsewhere: a buffer bound to a graph-mode wrapper is written outside metadata prep."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass

from flashcheck.verifier.astutil import (
    VIEW_METHODS,
    is_in_place_method,
    kwarg,
    storage_root,
)
from flashcheck.verifier.dataflow import Key, param_storage_keys, storage_keys
from flashcheck.verifier.engine import Context, Rule, rule
from flashcheck.verifier.flashinfer_api import (
    PLAN_METHODS,
    WRAPPER_BUFFERS,
    flashinfer_call_sites,
    wrapper_buffer_args,
    wrapper_buffer_for,
)
from flashcheck.verifier.hotpath import METADATA_CATEGORIES
from flashcheck.verifier.index import owner_of, with_bases
from flashcheck.verifier.kernels import kernel_writes, triton_launches
from flashcheck.verifier.loops import loop_containers
from flashcheck.verifier.paths import runs_after, runs_before
from flashcheck.verifier.project import FunctionInfo
from flashcheck.verifier.provenance.flow import arg_for_param
from flashcheck.verifier.rules.fc101_host_sync import snippet
from flashcheck.verifier.withblocks import CM_METHODS, last_plan_before, with_sites


@dataclass(frozen=True)
class Binding:
    fn: FunctionInfo
    call: ast.Call
    param: str
    wrapper: str


@rule("FC104", "graph-buffer-written-elsewhere")
class GraphBufferWrittenElsewhere(Rule):
    """A buffer bound to a CUDA-graph-mode wrapper is written in place outside metadata preparation.

    What it checks
        Tensors (or views of them) passed as persistent buffers to a FlashInfer wrapper (or a project subclass of one;
        by keyword only where the subclass defines its own ``__init__``) built with ``use_cuda_graph=True`` (or a flag
        the value flow shows may be ``True``: ``use_cuda_graph=self.is_cuda_graph`` on metadata whose graph copy is
        ``dataclasses.replace(meta, is_cuda_graph=True)``; also both through a ``**kwargs`` dict the call spreads, a
        factory's ``ChainMap(dict(extra), overrides, defaults)`` holding what that call passed)
        (``paged_kv_indptr_buffer=``, ``paged_kv_indices_buffer=``, ``qo_indptr_buf=``, MLA's
        ``qo_indptr=``/``kv_indptr=``/``kv_indices=``/``kv_len_arr=``, each buffer of a cascade's ``*_buf_arr=`` lists,
        given as literals, comprehensions over or indexing a list, or a list passed whole, a ``CUDAGraph*Wrapper``'s
        buffers...), tracked through slices, views, local aliases, loop variables over lists and dicts of buffers (``for
        buf in self.kv_indices``; each name of a ``zip``, ``enumerate`` or ``.items()`` loop at its own position, so a
        host mirror zipped beside a bound buffer stays its own; a loop over a dict whose items are bound under constant
        keys, ``for buf in self.graph_bufs.values()``, writes each), ``self.<attr>`` (in a method of a base class or
        mixin, also the attribute of each subclass that inherits it), module globals, other objects' attributes
        (``self.backend.kv_indptr``, also named by reflection: ``vars(bufs)["kv_indptr"]``,
        ``bufs.__dict__["kv_indptr"]``, ``getattr(bufs, "kv_indptr")``,
        ``operator.attrgetter("_paged_kv_indices_buf")(w)``; where only subclasses of the object's declared class store
        the attribute, each such subclass's), ``@property`` getters that return the buffer or a view of it
        (``metadata.kv_indptr`` returning ``self._kv_indptr``), fields of per-step objects that a constructor call, or a
        copy (``meta._replace(...)`` of a NamedTuple, ``dataclasses.replace``), fills with a view of the buffer
        (``StepMetadata(paged_kv_indptr=self.paged_kv_indptr[: bs + 1])``, then ``md.paged_kv_indptr[...] = ...``, or
        ``self.paged_kv_indptr[...]`` in a method of ``StepMetadata``) or that code stores the buffer into after
        building the object (``fb.kv_indices = self.kv_indices``, then ``fb.kv_indices[pos] = ...`` wherever a
        ``ForwardBatch`` is handed, or ``self.kv_indices.add_(1)`` in a method of its class), a local buffer that the
        function keeps in a lasting place (``self.graphs[bs] = {"indptr": indptr, ...}``, then ``graph["indptr"][...] =
        ...``; ``self.kv_indptr.append(buf)``, ``+= [buf]``, ``.extend([buf])`` (not a tuple of it and others: its items
        lose their positions), then ``self.kv_indptr[i][...] = ...``), items of dicts under string keys
        (``bufs["kv_indptr"]``; a dict literal that holds a bound buffer, ``self.graph_bufs = {"kv_indices":
        self.kv_indices}``, makes its item that buffer, also after ``bufs = self.attn.graph_bufs``; a dict bound item by
        item through a variable key, ``paged_kv_indices_buffer=self.kv_indices[s]`` for each stream ``s``, makes its
        items under the keys the loop takes bound, ``self.kv_indices["succ"]``, and not an item under another key),
        ``self.x = other.y`` aliases and constructor parameters (a backend built with ``Step(self.kv_indptr[i])`` binds
        a row, so a view, of its caller's buffer; also spread from a local tuple, ``Builder(cfg, *graph_bufs)``, and
        read on another object of the class: ``meta.kv_last_page_len``), also forwarded through a second function's
        parameter (``planner.plan(si.indptr, ...)`` handing it to the helper that builds the wrapper); the wrapper's own
        private buffers (``w._paged_kv_indptr_buf``, also through a local alias or view) count too: where the value flow
        finds the wrapper (an attribute, an item of a dict or list of wrappers, ``wrappers.get(bs)``, a parameter), as
        the argument its constructor was given for that buffer (keyword or position), and not at all when every wrapper
        found is out of graph mode. Then every in-place write of the same storage (``buf[...] = ...``, ``buf.copy_()``,
        ``buf.fill_()``, ``buf.zero_()``, any other in-place ``*_`` method but ``resize_``, a reallocation that FC107
        reports, ``out=buf``, ``buf += ...``, a launch of a project ``@triton.jit`` kernel whose
        ``tl.store``/``tl.atomic_*`` pointers come from that argument), directly or through a helper that writes its
        parameter or the buffer: outside replay preparation it is reported, except in the binding function, in
        ``__init__`` and in ``init_*`` set-up functions; on a replay-preparation path (replay, metadata and plan roots,
        ``replay-prep-paths``; and a function a capture root reaches that plans itself, as a ``plan_capture(bs)`` that
        fills dummies into the bound buffers before the capture's plan) a write **after** the function's last ``plan()``
        (direct, or a call that plans) is reported, once a plan has run on its own path and unless one may run after it
        there (a plan in another branch of an ``if`` or ``match``, or in a branch that returned, neither precedes nor
        follows it; one later in an enclosing loop (unless a ``break`` or a generator stage's ``yield`` leaves it first:
        its consumer replays then), a ``finally`` or a ``try``'s ``else`` follows it; a path that raises replays
        nothing; a generator's ``yield``, also at the end of a ``with`` block, starts the path again), and a write
        before it is the required pattern (a call of a function that plans counts as a plan, also through a method alias
        kept in an attribute: ``self.update = self.update_single_wrapper``); the ``__enter__`` and ``__exit__`` of a
        project class that replay-prep code uses in a ``with`` statement run where its block begins and ends, so their
        writes are reported where they are when the block begins or ends after that function's last plan (padding after
        the plan the block wraps) and stay quiet when a plan follows (a staging upload whose block ends before the
        plan). Each write is reported once: at the line that writes when its function is itself reported there, else at
        the call (a helper that writes its parameter, a replay-prep helper or ``init_*`` function called from
        elsewhere).

    Why it breaks serving
        A graph-mode wrapper does not copy these buffers: ``plan()`` before each replay reads and fills them and the
        captured kernels read them by address. Code elsewhere that reuses the storage for its own purposes (an SGLang
        fork: the sparse forward rewrote the shared ``kv_indptr`` inside the captured graph) leaves values that the next
        ``plan()`` reads as its input, and after minutes of serving replay fails with a non-monotone ``kv_indptr`` or,
        worse, reads another request's KV.

    Example
        ::

            self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
                ws, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=self.kv_indptr[: bs + 1], ...)
            ...
            def forward_decode(self, q, ...):
                self.kv_indptr[1 : bs + 1] = torch.cumsum(sparse_lens, 0)    # FC104

    Use instead
        Give the other user its own buffer; or keep a read-only copy of precomputed contents and restore it in the
        replay preparation before ``plan()``; write graph-bound buffers only on the metadata path.

    Known false positives
        Writes in a helper that the analysis cannot connect to a replay/metadata root (called through an unresolved
        object) are reported; add the helper to ``replay-prep-paths`` or suppress with a reason.

    What it cannot see
        Writes by kernels outside the project that take the buffer positionally (a C++/CUDA extension filling
        ``kv_indices``), storage reached through objects whose type neither annotations (of parameters, fields and
        locals) nor the value flow (back to a constructor call, also through ``weakref.ref``/``weakref.proxy``)
        give, and ordering across functions beyond "this call plans": a write in one method that a caller runs after
        ``plan()`` in another is judged where the call is; a decorator's wrapper that writes after calling the function
        it wraps (``out = fn(self, bs); self.last_page_len[n:bs].fill_(1)``) is not read as writing after that
        function's plan; storage a descriptor keeps under a computed name (``setattr(obj, self.slot, t)``).
    """

    def check(self, ctx: Context) -> None:
        bindings: dict[Key, Binding] = {}
        items: dict[Key, frozenset[str] | None] = {}  # dicts bound item by item: the keys bound (None: unknown)
        flashinfer_sites = flashinfer_call_sites(ctx.project, ctx.wrappers.subclass_names())
        for fn in ctx.project.all_functions():
            for call in fn.calls if id(fn) in flashinfer_sites else ():
                built = ctx.wrappers.constructed(call, fn)  # also a project subclass of a wrapper
                if built is None:
                    continue
                cls_name, positions_known = built
                mode = ctx.wrappers.graph_mode(call, cls_name, fn, positions=positions_known)
                if mode is not True and not (mode is None and _may_be_graph_mode(ctx, call, fn)):
                    continue
                bases = {c.qualname for c in with_bases(owner_of(fn).cls)[1:]}
                keywords = {kw.arg for kw in call.keywords}
                handed = [(param, expr, fn, param in keywords) for param, expr in wrapper_buffer_args(call, cls_name)]
                for spread in (kw.value for kw in call.keywords if kw.arg is None):  # **wrapper_kwargs(...)
                    for param in _SPREAD_BUFFERS:
                        handed += [(param, v, w, True) for v, w in ctx.prov.flow.spread_values(spread, param, fn)[:4]]
                for param, expr, where, by_keyword in handed:
                    if not positions_known and not by_keyword:
                        continue  # a subclass's own __init__: its positions are not FlashInfer's
                    typer = ctx.prov.flow.instance_type
                    keys = storage_keys(expr, where, project=ctx.project, typer=typer)
                    keys = keys or param_storage_keys(expr, where, 0, ctx.project, typer)  # a constructor's parameter
                    # the buffer itself and the storage it aliases (a caller's row), not the same name in bases
                    for key in keys[:1] + [k for k in keys[1:] if k[1] not in bases]:
                        bindings.setdefault(key, Binding(fn, call, param, cls_name))
                    item = _variable_item(expr)
                    if item is not None and keys:  # self.kv_indices[s]: the streams s may be
                        names = ctx.prov.flow.attribute_names(item, where, call.lineno)
                        known = items.get(keys[0], frozenset())
                        items[keys[0]] = None if not names or known is None else known | frozenset(names)
        if not bindings:
            return
        prep = ctx.hot.reach_categories(METADATA_CATEGORIES)
        capture = ctx.hot.reach_categories(frozenset({"capture"}))
        binders = {id(b.fn) for b in bindings.values()}

        def reported_in_place(fn: FunctionInfo) -> bool:
            """Writes in `fn` are reported where they are (so a call of `fn` need not be reported again)."""
            exempt = id(fn) in binders or fn.name in ("__init__", "__post_init__") or fn.name.startswith("init_")
            return fn not in prep and not exempt

        flow = _Flow(ctx, bindings, items, reported_in_place)
        blocks = with_sites(ctx.project, flow.writes_bound)
        for method, sites in blocks.values():
            for w, _ in sites:  # with Pad(...) in a helper that plans nothing: its writes are the helper's
                flow.entered.setdefault(id(w), []).append(method)
        for fn in ctx.project.all_functions():
            if id(fn) in binders or fn.name in ("__init__", "__post_init__"):
                continue
            if fn in prep:
                self._check_order(ctx, fn, flow)
            elif fn in capture and flow.plan_lines(fn) and not fn.name.startswith("init_"):
                self._check_capture_prep(ctx, fn, flow)  # a capture's own planning helper
            elif id(fn) in blocks:  # a context manager's __enter__/__exit__: run where a `with` block begins/ends
                self._check_entered(ctx, fn, flow, blocks[id(fn)][1], lambda w: w in prep or not reported_in_place(w))
            elif not fn.name.startswith("init_"):  # initialisers that no replay path reaches set buffers up
                for node, b, key in flow.writes(fn):
                    self._hit(
                        ctx,
                        fn,
                        node,
                        b,
                        key,
                        f"{fn.short} is not on a replay/metadata path, so the next plan() reads what it left",
                    )

    def _check_entered(
        self,
        ctx: Context,
        fn: FunctionInfo,
        flow: _Flow,
        sites: list[tuple[FunctionInfo, int]],
        on_path: Callable[[FunctionInfo], bool],
    ) -> None:
        """`fn` runs where ``with`` blocks begin or end (`sites`): its writes are off the replay path where one such
        block is (forward code), else after the plan where a replay-prep function's block begins or ends after its
        last plan; quiet where each block begins or ends before a plan (a staging upload)."""
        off = [w for w, _ in sites if not on_path(w)]
        late = [(w, p) for w, line in sites if (p := last_plan_before(w, flow.plan_lines(w), line)) is not None]
        if off:
            why = f"{fn.short} runs as a `with` block in {off[0].short} begins or ends, off the replay/metadata path"
        elif late:
            w, p = late[0]
            why = f"it runs as a `with` block in {w.short} begins or ends, after its last plan() (line {p})"
        else:
            return
        for node, b, key in flow.writes(fn):
            self._hit(ctx, fn, node, b, key, f"{why}, so the replay reads values no plan was made for")

    def _check_order(self, ctx: Context, fn: FunctionInfo, flow: _Flow) -> None:
        """On a replay-prep path, buffers are filled before plan(); a write after the last plan() of the
        function (and before the replay) changes what the captured kernels read without a plan for it."""
        plans = flow.plan_lines(fn)
        if not plans:
            return
        for node, b, key in flow.writes(fn):
            line = getattr(node, "lineno", 0)
            later = runs_after(fn.node.body, line)  # a plan in a branch that returned earlier does not follow
            earlier = runs_before(fn.node.body, line)  # nor does one of a branch that returned precede it
            if any(p < line and earlier(p) for p in plans) and not any(p > line and later(p) for p in plans):
                self._hit(
                    ctx,
                    fn,
                    node,
                    b,
                    key,
                    f"{fn.short} writes it after the last plan() (line "
                    f"{max(p for p in plans if p < line)}), so the replay reads values no plan was made for",
                )

    def _check_capture_prep(self, ctx: Context, fn: FunctionInfo, flow: _Flow) -> None:
        """A function a capture reaches that plans itself (``plan_capture(bs)``): a write that a plan of its own
        follows on its path fills the buffers for that plan; any other write (after the plan, or on a branch that
        plans nothing: the graph-mode forward inside the capture) changes what the captured kernels read."""
        plans = flow.plan_lines(fn)
        for node, b, key in flow.writes(fn):
            later = runs_after(fn.node.body, getattr(node, "lineno", 0))
            if not any(p > getattr(node, "lineno", 0) and later(p) for p in plans):
                why = f"{fn.short} runs under a capture and no plan() of its own follows the write"
                self._hit(ctx, fn, node, b, key, f"{why}, so the captured kernels read values no plan was made for")

    def _hit(self, ctx: Context, fn: FunctionInfo, node: ast.AST, b: Binding, key: Key, why: str) -> None:
        sf = b.fn.source
        ctx.report(
            self,
            fn,
            node,
            f"`{snippet(node)}` writes `{key[2]}`, which is bound as {b.param} of a graph-mode {b.wrapper} in "
            f"{b.fn.short} ({sf.relpath}:{b.call.lineno}); {why}",
            hint="give this code its own buffer, or fill graph-bound buffers on the replay path before plan()",
            evidence={
                "buffer": key[2],
                "bound_at": f"{sf.relpath}:{b.call.lineno}",
                "bound_in": b.fn.qualname,
                "parameter": b.param,
            },
        )


class _Flow:
    """Per-function summaries: which bound buffers a function writes (directly, through a helper's parameter or
    a callee), which parameters it writes, and where it plans (directly or through callees)."""

    def __init__(
        self,
        ctx: Context,
        bindings: dict[Key, Binding],
        items: dict[Key, frozenset[str] | None],
        reported_in_place: Callable[[FunctionInfo], bool],
    ) -> None:
        self.ctx = ctx
        self.bindings = bindings
        self.items = items
        self.reported_in_place = reported_in_place
        self._param_writes: dict[int, set[str]] = {}
        self._plans: dict[int, bool] = {}
        self._bound_writes: dict[int, bool] = {}
        self.entered: dict[int, list[FunctionInfo]] = {}  # id(fn) -> __enter__/__exit__ its with statements run
        self.item_bindings: dict[Key, list[Key]] = {}  # a dict's key -> the keys of its items bound under constants
        for key in bindings:
            if (m := _ITEM.search(key[2])) is not None:
                self.item_bindings.setdefault((key[0], key[1], key[2][: m.start()]), []).append(key)

    def writes(self, fn: FunctionInfo) -> list[tuple[ast.AST, Binding, Key]]:
        """Writes of bound storage in `fn`: its own, and calls of helpers that write an argument or a buffer."""
        out: list[tuple[ast.AST, Binding, Key]] = []
        project = self.ctx.project
        for node, target in _writes(fn):
            found = self._bound(target, fn)
            if found is not None:
                out.append((node, *found))
        for callee, call in project.callees(fn):
            if self.plans(callee):
                continue
            for p in self.param_writes(callee):
                arg = arg_for_param(call, callee, p)
                found = self._bound(arg, fn) if arg is not None else None
                if found is not None and found[0].fn is not callee:  # the binder initialises what it binds
                    out.append((call, *found))
                    break
            else:
                deep = self._deep_bound(callee) if self.writes_bound(callee) else None
                # else reported where it writes, or the write initialises the buffer where it is bound
                if deep is not None and not self.reported_in_place(deep[0]) and deep[1].fn is not deep[0]:
                    out.append((call, deep[1], deep[2]))
        for kernel, call in triton_launches(
            fn, project
        ):  # kernel[grid](..., kv_indices, ...): what its tl.store writes
            for p in kernel_writes(kernel):
                arg = arg_for_param(call, kernel, p)
                found = self._bound(arg, fn) if arg is not None else None
                if found is not None:
                    out.append((call, *found))
                    break
        return out

    def _bound(self, target: ast.expr, fn: FunctionInfo) -> tuple[Binding, Key] | None:
        start = storage_root(target)
        looped = isinstance(start, ast.Name) and bool(loop_containers(start.id, fn, start.lineno))
        looped = looped and isinstance(start, ast.Name) and _every_item(start, fn)
        for key in storage_keys(target, fn, project=self.ctx.project, typer=self.ctx.prov.flow.instance_type):
            for k, item in _with_containers(key):  # self.kv_indices["succ"]: an item of a dict bound item by item
                if item is not None and not _item_bound(self.items, k, item):
                    continue
                b = self.bindings.get(k)
                if b is not None:
                    return b, k
            for k in self.item_bindings.get(key, [])[:1] if looped else []:  # for b in self.graph_bufs.values()
                return self.bindings[k], k
        root = _alias_root(start, fn)
        if isinstance(root, ast.Attribute) and root.attr in WRAPPER_BUFFERS:  # the wrapper's own graph buffers
            return self._wrapper_buffer(root, fn)
        return None

    def _wrapper_buffer(self, root: ast.Attribute, fn: FunctionInfo) -> tuple[Binding, Key] | None:
        """The binding behind a wrapper's private buffer (``w._paged_kv_indices_buf``): the storage its constructor
        was given, where the value flow finds the wrapper (an attribute, an item of a dict or list of wrappers, a
        parameter); none when every wrapper found is out of graph mode; any binding when none is found."""
        built = self.ctx.wrappers.constructions(root.value, fn)
        modes = self.ctx.wrappers.graph_mode
        graph = [(call, where, cls) for call, where, cls in built if modes(call, cls, where) is not False]
        typer = self.ctx.prov.flow.instance_type
        for call, where, cls in graph:
            arg = wrapper_buffer_for(call, cls, root.attr)
            for key in storage_keys(arg, where, project=self.ctx.project, typer=typer) if arg is not None else []:
                if key in self.bindings:
                    return self.bindings[key], key
            for b in self.bindings.values():
                if b.call is call:
                    return b, ("wrapper", cls, root.attr)
        if built:
            return None
        for b in self.bindings.values():
            return b, ("wrapper", b.wrapper, root.attr)
        return None

    def _callee_bound(self, fn: FunctionInfo) -> list[tuple[Binding, Key]]:
        own = [(b, k) for node, target in _writes(fn) if (found := self._bound(target, fn)) for b, k in [found]]
        if not own and fn.name not in CM_METHODS and not self._direct_plans(fn):
            own = [bk for m in self.entered.get(id(fn), [])[:4] for bk in self._callee_bound(m)]
        return own

    def _deep_bound(self, fn: FunctionInfo, depth: int = 4) -> tuple[FunctionInfo, Binding, Key] | None:
        """The first bound write in `fn` or the functions it calls (at most `depth` calls away), with the function
        that writes."""
        own = self._callee_bound(fn)
        if own:
            return (fn, *own[0])
        for callee, _ in self.ctx.project.callees(fn) if depth > 0 else []:
            if callee is not fn and self.writes_bound(callee):
                found = self._deep_bound(callee, depth - 1)
                if found is not None:
                    return found
        return None

    def writes_bound(self, fn: FunctionInfo) -> bool:
        """Whether `fn` or a function it calls writes a graph-bound buffer."""
        return self._transitive(fn, self._bound_writes, lambda f: bool(self._callee_bound(f)), 4)

    def _transitive(
        self, fn: FunctionInfo, memo: dict[int, bool], here: Callable[[FunctionInfo], bool], depth: int
    ) -> bool:
        """`here` holds in `fn` or in a callee at most `depth` calls away (memoised; recursion counts as no)."""
        key = id(fn)
        if key not in memo:
            memo[key] = False  # recursion guard
            memo[key] = here(fn) or (
                depth > 0 and any(self._transitive(c, memo, here, depth - 1) for c, _ in self.ctx.project.callees(fn))
            )
        return memo[key]

    def param_writes(self, fn: FunctionInfo, depth: int = 0) -> set[str]:
        """Parameters whose storage `fn` writes (directly, through local views, or by passing them on)."""
        key = id(fn)
        if key in self._param_writes:
            return self._param_writes[key]
        self._param_writes[key] = set()
        params = set(fn.params) - {"self", "cls"}
        out: set[str] = set()
        for _, target in _writes(fn):
            root = _param_root(storage_root(target), fn)
            if root in params:
                out.add(root)
        callees = self.ctx.project.callees(fn) if depth < 4 else []
        launched = [(k, c, kernel_writes(k)) for k, c in triton_launches(fn, self.ctx.project)]
        for callee, call, written in [*((c, call, self.param_writes(c, depth + 1)) for c, call in callees), *launched]:
            for p in written:
                arg = arg_for_param(call, callee, p)
                root = _param_root(storage_root(arg), fn) if arg is not None else None
                if root in params:
                    out.add(root)
        self._param_writes[key] = out
        return out

    def plans(self, fn: FunctionInfo) -> bool:
        """Whether `fn` or a function it calls runs a FlashInfer plan."""
        return self._transitive(fn, self._plans, lambda f: bool(self._direct_plans(f)), 6)

    def _direct_plans(self, fn: FunctionInfo) -> list[int]:
        out = []
        for call in fn.calls:
            f = call.func
            if (isinstance(f, ast.Attribute) and f.attr in PLAN_METHODS) or self.ctx.wrappers.callable_target(f, fn):
                out.append(call.lineno)
        return out

    def plan_lines(self, fn: FunctionInfo) -> list[int]:
        """Lines of `fn` that plan: plan calls and calls of functions that plan."""
        lines = self._direct_plans(fn)
        lines.extend(call.lineno for callee, call in self.ctx.project.callees(fn) if self.plans(callee))
        return lines


_ITEM = re.compile(r"\[(?:'[^']*'|\"[^\"]*\")\]$")


def _every_item(name: ast.Name, fn: FunctionInfo) -> bool:
    """Whether the loop that binds `name` writes it for every item: the write is a statement of the loop's body
    itself (or of a ``with`` there), not under a test that may skip items (``if key not in BOUND:``)."""
    loops = [n for n in ast.walk(fn.node) if isinstance(n, ast.For | ast.AsyncFor) and n.lineno <= name.lineno]
    around = [n for n in loops if name.lineno <= (n.end_lineno or n.lineno)]
    body = min(around, key=lambda n: (n.end_lineno or n.lineno) - n.lineno).body if around else []
    while True:
        stmt = next((st for st in body if st.lineno <= name.lineno <= (st.end_lineno or st.lineno)), None)
        if not isinstance(stmt, ast.With | ast.AsyncWith):
            return stmt is not None and not hasattr(stmt, "body")
        body = stmt.body


def _with_containers(key: Key) -> list[tuple[Key, str | None]]:
    """`key`, then the key of each dict it is an item of with that item's name (``self.kv_indices['succ']``, then
    ``self.kv_indices`` and ``succ``): a buffer bound through a variable key (``paged_kv_indices_buffer=
    self.kv_indices[s]`` in a loop over the streams) is keyed by its container, so a write to an item of it under a
    key the loop takes writes a bound buffer."""
    out: list[tuple[Key, str | None]] = [(key, None)]
    kind, owner, text = key
    while (m := _ITEM.search(text)) is not None:
        item = m.group(0)[2:-2]
        text = text[: m.start()]
        out.append(((kind, owner, text), item))
    return out


def _item_bound(items: dict[Key, frozenset[str] | None], container: Key, item: str) -> bool:
    """Whether `container` is a dict bound item by item and `item` is under a key its binding loop takes (every key,
    when the loop's keys are not known)."""
    if container not in items:
        return False
    keys = items[container]
    return keys is None or item in keys


def _variable_item(expr: ast.expr) -> ast.Name | None:
    """The variable key of the dict item that `expr` views (``s`` of ``self.kv_last_page_len[s][:bs]``), if any."""
    node = expr
    while True:
        if isinstance(node, ast.Subscript):
            if isinstance(node.slice, ast.Name):
                return node.slice
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in VIEW_METHODS:
            node = node.func.value
        else:
            return None


_SPREAD_BUFFERS = (
    *("paged_kv_indptr_buffer", "paged_kv_indices_buffer", "paged_kv_last_page_len_buffer"),  # decode
    *("qo_indptr_buf", "paged_kv_indptr_buf", "paged_kv_indices_buf", "paged_kv_last_page_len_buf"),  # prefill
)


def _may_be_graph_mode(ctx: Context, call: ast.Call, fn: FunctionInfo) -> bool:
    """A wrapper whose ``use_cuda_graph=`` is not a literal but may be ``True``: the value flow reaches a ``True``
    (``use_cuda_graph=self.is_cuda_graph`` on metadata copied with ``dataclasses.replace(meta, is_cuda_graph=True)``,
    a flag a caller passes, a ``**kwargs`` dict that holds one)."""
    flag = kwarg(call, "use_cuda_graph")
    starts = [(flag, fn)] if flag is not None else []
    for spread in (kw.value for kw in call.keywords if kw.arg is None) if flag is None else ():
        starts += ctx.prov.flow.spread_values(spread, "use_cuda_graph", fn)
    return any(v is True for v in ctx.prov.flow.constants(starts, limit=32))


def _param_root(root: ast.expr, fn: FunctionInfo) -> str | None:
    """The parameter a storage root is (``buf``, or a local view ``v = buf[1:]``)."""
    root = _alias_root(root, fn)
    return root.id if isinstance(root, ast.Name) and root.id in fn.params else None


def _alias_root(root: ast.expr, fn: FunctionInfo) -> ast.expr:
    """A storage root with local aliases and views followed (``v = w._paged_kv_indices_buf[1:]``: the attribute),
    as long as each local has one value; a parameter stays itself."""
    for _ in range(4):
        if not isinstance(root, ast.Name) or root.id in fn.params:
            return root
        values = fn.local_assigns.get(root.id, [])
        if len(values) != 1:
            return root
        root = storage_root(values[0])
    return root


def _writes(fn: FunctionInfo) -> list[tuple[ast.AST, ast.expr]]:
    out: list[tuple[ast.AST, ast.expr]] = []
    for a in fn.assigns:
        targets = a.targets if isinstance(a, ast.Assign) else [a.target]
        for t in targets:
            if isinstance(t, ast.Subscript):
                if isinstance(t.slice, ast.Constant) and isinstance(t.slice.value, str):
                    continue  # meta["kv_indptr"] = ... rebinds a dict entry
                out.append((a, t.value))
            elif isinstance(a, ast.AugAssign):
                out.append((a, t))
    for call in fn.calls:
        f = call.func
        # resize_ reallocates rather than writes: FC107 reports it on per-step and replay paths
        if isinstance(f, ast.Attribute) and is_in_place_method(f.attr) and f.attr != "resize_":
            out.append((call, f.value))
        o = kwarg(call, "out")
        if o is not None:
            out.append((call, o))
    return out
