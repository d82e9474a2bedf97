"""FC105 empty-workspace-for-zeroing-kernel: a ``torch.empty`` workspace handed to a kernel that needs zeros."""

from __future__ import annotations

import ast

from flashcheck.verifier.astutil import enclosing_tests, kwarg, terminal_name
from flashcheck.verifier.dataflow import allocations, storage_keys
from flashcheck.verifier.engine import Context, Rule, rule
from flashcheck.verifier.flashinfer_api import (
    ZEROED_WORKSPACE_BACKENDS,
    is_wrapper_class_name,
    needs_zeroed_workspace,
    workspace_arg,
    wrapper_class_of_call,
)
from flashcheck.verifier.index import descendants, owner_of, with_bases
from flashcheck.verifier.project import ClassInfo, FunctionInfo, torch_name
from flashcheck.verifier.provenance.flow import arg_for_param
from flashcheck.verifier.rules.fc101_host_sync import snippet
from flashcheck.verifier.sequences import sequence_items

_UNINITIALISED = frozenset({"empty", "empty_like", "empty_strided", "new_empty"})


@rule("FC105", "empty-workspace-for-zeroing-kernel")
class EmptyWorkspaceForZeroingKernel(Rule):
    """A workspace allocated with ``torch.empty`` is given to a kernel that requires a zeroed workspace.

    What it checks
        The workspace argument of FlashInfer kernels that keep counters in it and need it zeroed before first use:
        ``trtllm_batch_decode_with_kv_cache`` and ``..._mla``, ``trtllm_batch_context_with_kv_cache``, the XQA decode
        functions, wrappers constructed with ``backend="trtllm-gen"`` (or another trtllm/XQA backend, also a
        ``backend=`` value that the value flow traces to one: ``"trtllm-gen" if use_trtllm else "fa2"``, an attribute
        (in a base class's constructor, also a class attribute a subclass's body sets: ``backend=self.decode_backend``
        with ``decode_backend = "trtllm-gen"`` in a subclass, or its class statement's keyword through the base's
        ``__init_subclass__``; the workspace ``self.<attr>`` there is then also what that subclass stores), an entry of
        a table (``self.decode_backend[name]``) or a caller's argument, or a ``**kwargs`` dict that holds one: a
        literal, ``dict(backend=...)``, a helper's dict with ``kw["backend"] = "trtllm-gen"`` stored under a flag,
        or the keywords a factory forwards, ``make_decode_wrapper(ws, backend="trtllm-gen")`` building the wrapper with
        ``**filter_kwargs(kwargs)``: then each caller's workspace is judged by the backend that caller asks for), also
        under an import alias (``from flashinfer import BatchDecodeWithPagedKVCacheWrapper as DecodeW``,
        ``... trtllm_batch_decode_with_kv_cache as trt_decode``) or a module's alias of the class (``Decode =
        flashinfer.BatchDecodeWithPagedKVCacheWrapper``), plus the names listed in ``zeroed-workspace-consumers``.
        Wrappers on the FA2/FA3/cuDNN backends do not need a zeroed workspace and are not reported. The workspace is
        traced through aliases, loop variables (``for ws in (fresh, zeroed)``: each item), a closure's free variable
        (``ws = scratch(...)`` around ``def attend(...)``), ``self.<attr>``, attributes
        of other objects of known type (``self.buffers.workspace``, also where other code stores them: ``meta.ws =
        self._get_ws()`` read back as ``decode.ws`` after ``if decode := meta.decode_metadata``), parameters filled by
        the project's callers, project factories (``lru_cache``'d getters, also imported from regular packages inside
        namespace folders), module caches (``_CACHE[key] = torch.empty(...)``, also read back by a constant key), items
        of dicts and lists of workspaces (a comprehension or a literal, read back by key or index:
        ``self.workspaces[name]``; a key stored after the literal, ``self.ws["trtllm"] = torch.zeros(...)``, holds what
        was stored under it), module globals that a function assigns after ``global _WS`` (lazy initialisation read
        elsewhere) and both branches of conditional expressions (``shared or torch.empty(...)``) to its allocation. An
        allocation with ``torch.empty``/``empty_like``/``new_empty`` is reported unless the same storage is zeroed
        (``.zero_()``, ``.fill_(0)``; the items of a list a comprehension or literal builds, by a loop over it) in the
        allocating function on a path that can run: a zeroing under ``if zeroed:``
        (or the ``else`` of ``if not zeroed:``) where every project call passes, or defaults to, a false constant for
        ``zeroed`` does not count.

    Why it breaks serving
        These kernels keep semaphores and split-k counters in the workspace and assume they start at zero. Fresh memory
        from the caching allocator is often zero, so tests pass; after the allocator recycles a block that held
        activations, multi-CTA reductions wait on garbage counters (hang) or combine partial results that were never
        written (wrong attention output) only under memory pressure in production.

    Example
        ::

            self.workspace = torch.empty(512 * 1024 * 1024, dtype=torch.uint8, device=self.device)
            ...
            trtllm_batch_decode_with_kv_cache(q, kv_cache, self.workspace, block_tables, seq_lens, ...)  # FC105

    Use instead
        ``torch.zeros(...)`` once at start-up (share it between wrappers, as rtp-llm's ``g_zero_workspace_buffer``
        does), or ``.zero_()`` the buffer right after ``torch.empty``.

    Where it reports
        Everywhere, tests and benchmarks included (the other static rules are about serving code and are quiet
        there): a test that hands such a kernel fresh memory passes or fails by what the allocator left in it.

    Known false positives
        A buffer zeroed in a different function than the one that allocates it is reported; suppress with a reason
        naming where it is zeroed.

    What it cannot see
        A workspace handed in by a caller outside the project, or kept by an object whose type is unknown; a backend
        read from configuration that no project code sets (``backend=cfg.backend``) is not assumed to be trtllm-gen; a
        zeroing flag that callers set from configuration or variables counts as zeroing (only constants are judged).
    """

    # a test that hands such a kernel fresh memory passes or fails by what the allocator left there: reported
    serving_only = False

    def check(self, ctx: Context) -> None:
        extra = frozenset(ctx.config.zeroed_workspace_consumers)
        seen: set[int] = set()
        for fn in ctx.project.all_functions():
            for call in fn.calls:
                ws = workspace_arg(call, fn)
                consumer = needs_zeroed_workspace(call, extra, fn)
                found = []
                if consumer is None and isinstance(ws, ast.Name) and ws.id in fn.params:  # a factory's parameter:
                    for caller, c in ctx.project.callers(fn)[:16]:  # each caller's workspace with its own backend
                        picked = _runtime_backend(ctx, call, fn, via=c)
                        arg = arg_for_param(c, fn, ws.id) if picked is not None else None
                        consumer = consumer or (picked if arg is not None else None)
                        found += allocations(arg, caller, project=ctx.project) if arg is not None else []
                elif consumer is None:
                    consumer = _runtime_backend(ctx, call, fn)
                if consumer is None or ws is None:
                    continue
                if not found:
                    found = allocations(ws, fn, project=ctx.project, attr_values=ctx.prov.flow.class_attr_sources)
                for alloc, where in found + _subclass_workspaces(ctx, call, ws, fn):
                    kind = (torch_name(alloc.func, where) or terminal_name(alloc.func) or "").rsplit(".", 1)[-1]
                    if kind not in _UNINITIALISED or id(alloc) in seen or _zeroed_after(ctx, alloc, where):
                        continue
                    seen.add(id(alloc))
                    ctx.report(
                        self,
                        where,
                        alloc,
                        f"`{snippet(alloc)}` allocates an uninitialised workspace that {consumer} "
                        f"({fn.source.relpath}:{call.lineno}) requires to start zeroed",
                        hint="allocate it with torch.zeros (once, shared) or call .zero_() right after torch.empty",
                        evidence={"consumer": consumer, "used_at": f"{fn.source.relpath}:{call.lineno}"},
                    )


def _subclass_workspaces(
    ctx: Context, call: ast.Call, ws: ast.expr, fn: FunctionInfo
) -> list[tuple[ast.Call, FunctionInfo]]:
    """In a base class's method, ``self.<attr>`` is also what a subclass's own methods store there: a trtllm-gen
    subclass (``backend=self.decode_backend`` with the subclass's class attribute a zeroed-workspace backend) that
    allocates its own ``self.graph_ws`` for the graph wrappers its base builds."""
    cls = owner_of(fn).cls
    backend = kwarg(call, "backend")
    picked = backend.attr if isinstance(backend, ast.Attribute) and _on_self(backend) else None
    if not (isinstance(ws, ast.Attribute) and _on_self(ws)) or cls is None or picked is None or fn.name == "__init__":
        return []  # a wrapper the base's constructor builds takes the workspace before a subclass binds its own
    kept = [d for d in descendants(cls) if _class_constant(d, picked) in ZEROED_WORKSPACE_BACKENDS]
    own = [(v, w) for d in kept for v, w in d.attr_assigns.get(ws.attr, []) if w.cls is d]
    return [a for v, w in own[:8] for a in allocations(v, w, project=ctx.project)]


def _on_self(node: ast.Attribute) -> bool:
    return isinstance(node.value, ast.Name) and node.value.id == "self"


def _class_constant(cls: ClassInfo, attr: str) -> object:
    """The constant the class attribute `attr` of `cls` holds, the first class of its resolution order that sets it
    in its body (or through a class statement's keyword) deciding."""
    for c in with_bases(cls):
        body = [v for v, w in c.attr_assigns.get(attr, []) if not isinstance(w.node, ast.FunctionDef)]
        if body:  # the last: a class statement's keyword, set by __init_subclass__ after the body ran
            return body[-1].value if isinstance(body[-1], ast.Constant) else None
    return None


def _runtime_backend(ctx: Context, call: ast.Call, fn: FunctionInfo, via: ast.Call | None = None) -> str | None:
    """A wrapper whose ``backend=`` is not a literal but may be a trtllm/XQA one: ``backend=self.backend`` where the
    value flow reaches ``"trtllm-gen"`` (a conditional expression, a default, a caller's argument); with `via`, a
    call of `fn`, a ``**kwargs`` spread holds what that call passes."""
    name = wrapper_class_of_call(call, fn) or terminal_name(call.func)  # also under a module's alias of the class
    backend = kwarg(call, "backend")
    if name is None or isinstance(backend, ast.Constant) or not is_wrapper_class_name(name):
        return None
    stack: list[tuple[ast.expr, FunctionInfo]] = [(backend, fn)] if backend is not None else []
    for kw in call.keywords if backend is None else []:  # **self._backend_kwargs(): a dict that may hold backend=
        if kw.arg is None:
            stack.extend(ctx.prov.flow.spread_values(kw.value, "backend", fn, via))
    for value in ctx.prov.flow.constants(stack):
        if isinstance(value, str) and value in ZEROED_WORKSPACE_BACKENDS:
            return f'{name}(backend="{value}")'
    return None


def _zeroed_after(ctx: Context, alloc: ast.Call, fn: FunctionInfo) -> bool:
    """Whether the allocating function zeroes the same storage (``ws.zero_()``, ``ws.fill_(0)``) on a path that
    can run (the items of a list a comprehension or literal builds, through a loop over it: ``for ws in
    self.workspaces: ws.zero_()``, not one item, ``self.workspaces[0].zero_()``): a zeroing under
    ``if zeroed:`` where every caller passes a false constant for ``zeroed`` is not one."""
    targets: set[tuple[str, str, str]] = set()
    items: set[tuple[str, str, str]] = set()  # lists the allocation is an item of: zeroed through a loop over them
    for a in fn.assigns:
        if not isinstance(a, ast.Assign) or not (
            a.value is alloc or any(e is alloc for e in sequence_items(a.value, fn))
        ):
            continue
        for t in a.targets:
            (targets if a.value is alloc else items).update(storage_keys(t, fn) or [("local", "", ast.unparse(t))])
    if isinstance(fn.node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef) and (targets or items):
        for call in fn.calls:
            f = call.func
            if isinstance(f, ast.Attribute) and (
                f.attr == "zero_"
                or (
                    f.attr == "fill_"
                    and call.args
                    and isinstance(call.args[0], ast.Constant)
                    and call.args[0].value == 0
                )
            ):
                keys = set(storage_keys(f.value, fn)) | {("local", "", ast.unparse(f.value))}
                looped = isinstance(f.value, ast.Name) and f.value.id in fn.loop_vars  # for ws in self.ws: ws.zero_()
                if (keys & targets or (looped and keys & items)) and not _never_runs(ctx, call, fn):
                    return True
    return False


def _never_runs(ctx: Context, node: ast.AST, fn: FunctionInfo) -> bool:
    """`node` sits in a branch that no call of `fn` takes: under ``if flag:`` (or the ``else`` of ``if not
    flag:``) where every project call passes, or defaults to, a false constant for parameter ``flag``."""
    for test, in_body in enclosing_tests(fn.node, node):
        value = _constant_truth(ctx, test, fn)
        if value is not None and value is not in_body:
            return True
    return False


def _constant_truth(ctx: Context, test: ast.expr, fn: FunctionInfo) -> bool | None:
    """The truth of a test on a parameter that every call fixes to one constant truth value; None otherwise."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _constant_truth(ctx, test.operand, fn)
        return None if inner is None else not inner
    if not isinstance(test, ast.Name) or test.id not in fn.params or isinstance(fn.node, ast.Module):
        return None
    args = fn.node.args
    positional = [*args.posonlyargs, *args.args]
    defaults = dict(
        zip([a.arg for a in positional[len(positional) - len(args.defaults) :]], args.defaults, strict=False)
    )
    defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=False) if d is not None})
    truths: set[bool] = set()
    callers = ctx.project.callers(fn)
    for _, call in callers:
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            return None
        value = arg_for_param(call, fn, test.id)
        if value is None:
            value = defaults.get(test.id)
        if not isinstance(value, ast.Constant):
            return None
        truths.add(bool(value.value))
    return truths.pop() if len(truths) == 1 else None
