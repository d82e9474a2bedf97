"""FC108 non-graph-wrapper-in-capture: a wrapper built without ``use_cuda_graph=True`` runs inside a capture."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from flashcheck.verifier.dataflow import Key, storage_keys
from flashcheck.verifier.engine import Context, Rule, rule
from flashcheck.verifier.flashinfer_api import RUN_METHODS, flashinfer_call_sites
from flashcheck.verifier.hotpath import HotPaths
from flashcheck.verifier.project import FunctionInfo
from flashcheck.verifier.rules.fc101_host_sync import snippet


@dataclass(frozen=True)
class Built:
    fn: FunctionInfo
    call: ast.Call
    wrapper: str
    graph: bool | None


@rule("FC108", "non-graph-wrapper-in-capture")
class NonGraphWrapperInCapture(Rule):
    """A FlashInfer wrapper built without ``use_cuda_graph=True`` is run on a CUDA-graph capture path.

    What it checks
        Wrappers (also imported under another name: ``from flashinfer import BatchDecodeWithPagedKVCacheWrapper as
        Decode``) constructed (into ``self.<attr>``, a list or dict of them, or a local) without ``use_cuda_graph=True``
        (absent or ``False``; ``CUDAGraph*`` wrappers are graph-mode), whose ``run()`` / ``forward()`` /
        ``run_return_lse()`` is called in a function reachable from a capture root (``capture_one_batch_size``,
        ``init_forward_metadata_capture_cuda_graph``, ``capture-paths``). A receiver that is also bound to a graph-mode
        wrapper, or whose mode is a variable, is not reported. Receivers are matched to constructions by where they are
        stored and, failing that, by the value flow: a wrapper returned by a factory function, passed in by a caller,
        kept in another object, or chosen by a conditional expression (``w = self.eager[k] if self.graph_bs is None else
        self.graphs[bs][k]`` is quiet: one branch is a graph-mode wrapper, and which branch runs during capture is a
        run-time fact; so is a local assigned in both branches of an ``if``). ``self.impl.forward(...)`` where
        ``self.impl`` holds one of several classes runs the method of each, and so does a loop over layers of several
        classes (a list built by ``append``, a literal, a comprehension, a concatenation or ``nn.Sequential(*layers)``),
        also where the layer is called (``layer(q)``, ``self.heads[kind](x)``: each class's ``forward``). An object seen
        built as one class runs that class's methods, not its subclasses' overrides, even in a list declared with a base
        class; one the analysis does not see built (a backend a registry factory builds, handed down constructors
        declared with an abstract base) runs each subclass's override of a method the base only declares. A dict's
        items include what other objects store into it (``self.backend.graph_wrappers[bs] = w`` in a
        graph runner).

    Why it breaks serving
        A wrapper outside graph mode reallocates its index buffers on every ``plan()`` and lets ``run()`` pick
        kernels and split counts from the latest plan. Captured once, the graph keeps the capture-time pointers and
        launch configuration: the replay reads freed or stale indptr/indices (wrong outputs, illegal memory access)
        as soon as a later ``plan()`` moves them.

    Example
        ::

            self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD")
            ...
            def forward_decode(self, q, kv_cache):          # reached from capture_one_batch_size
                return self.decode_wrapper.run(q, kv_cache)  # FC108

    Use instead
        Build one wrapper per captured batch size with ``use_cuda_graph=True`` and persistent
        ``paged_kv_indptr_buffer``/``paged_kv_indices_buffer``/``paged_kv_last_page_len_buffer``, and select it by
        batch size in both capture and replay.

    Known false positives
        A run call on a capture path that is only taken in eager mode (behind a ``if not capturing:`` branch) is
        reported, unless the branch tests a parameter or a field of the capture batch that the capture path sets to a
        constant (``if not fb.use_graph:`` under the capture root's ``Batch(..., use_graph=True)``; an enum member,
        ``if fb.forward_mode.is_decode():`` under ``forward_mode=ForwardMode.DECODE``; ``if fb.num_prefills > 0:``;
        also a handler table keyed by it); a field set from a variable (``forward_mode=self.capture_mode``) or an
        object built elsewhere decides nothing, and neither does a method called through a bound method kept in an
        attribute (``self.attend = drafter.draft_attention``); suppress with a reason.

    What it cannot see
        Wrappers handed in from outside the project, and run calls reached only through objects whose type the analysis
        cannot resolve (closures a project function returns are followed: ``fn = make_stage_fn(w); fn(q)`` runs the
        returned nested function, with `w` bound). Code in a branch that every path to its function rules out with a
        constant argument (``if not skip_eplb:`` when every call passes ``skip_eplb=True``; ``docs/static.md``) is not
        checked.
    """

    def check(self, ctx: Context) -> None:
        built: dict[Key, list[Built]] = {}
        flashinfer_sites = flashinfer_call_sites(ctx.project, ctx.wrappers.subclass_names())
        for fn in ctx.project.all_functions():
            for a in fn.assigns if id(fn) in flashinfer_sites else ():
                if not isinstance(a, ast.Assign):
                    continue
                for call in _constructor_calls(a.value):
                    made = ctx.wrappers.constructed(call, fn)  # also a project subclass of a wrapper
                    if made is None:
                        continue
                    cls_name, positions_known = made
                    mode = ctx.wrappers.graph_mode(call, cls_name, fn, positions=positions_known)
                    for t in a.targets:
                        local = [("local", fn.qualname, t.id)] if isinstance(t, ast.Name) else []
                        for key in storage_keys(t, fn) or local:
                            built.setdefault(key, []).append(Built(fn, call, cls_name, mode))
        capture = ctx.hot.reach("capture")
        for fn in capture:
            for call in fn.calls:
                func = call.func
                if not isinstance(func, ast.Attribute) or func.attr not in RUN_METHODS:
                    continue
                if not ctx.hot.live(fn, call, "capture"):
                    continue  # under a flag every capture path sets against it (``if not skip_prefill:``)
                for found in _receiver_builds(ctx, func.value, fn, built):
                    if any(b.graph is not False for b in found):
                        continue
                    b = found[0]
                    root = capture[fn].root
                    ctx.report(
                        self,
                        fn,
                        call,
                        f"`{snippet(call)}` runs a {b.wrapper} built without use_cuda_graph=True "
                        f"({b.fn.source.relpath}:{b.call.lineno}) on a capture path (root {root.fn.short})",
                        hint="build a graph-mode wrapper (use_cuda_graph=True, persistent index buffers) per "
                        "captured batch size and use it here",
                        chain=HotPaths.chain(fn, capture),
                        evidence={"built_at": f"{b.fn.source.relpath}:{b.call.lineno}", "wrapper": b.wrapper},
                    )


def _receiver_builds(
    ctx: Context, recv: ast.expr, fn: FunctionInfo, built: dict[Key, list[Built]]
) -> list[list[Built]]:
    """The constructions a run() receiver may be: by its storage key, else by the value flow (a wrapper returned
    by a factory, passed in by a caller, or kept in another object). A local chosen by a condition (``w = a if
    eager else b``, or assigned in both branches of an ``if``) is read through the value flow, which keeps every
    assignment that reaches the call (a storage key names one)."""
    assigned = fn.local_assigns.get(recv.id, []) if isinstance(recv, ast.Name) else []
    chosen = len(assigned) > 1 or any(isinstance(v, ast.IfExp | ast.BoolOp) for v in assigned)
    for key in [] if chosen else _receiver_keys(recv, fn, built):
        if built.get(key):
            return [built[key]]
    flows = [
        Built(where, call, cls, ctx.wrappers.graph_mode(call, cls, where))
        for call, where, cls in ctx.wrappers.constructions(recv, fn)
    ]
    return [flows] if flows else []


def _receiver_keys(recv: ast.expr, fn: FunctionInfo, built: dict[Key, list[Built]]) -> list[Key]:
    """The storage key of a run() receiver; ``self.d["k"]`` also as ``self.d`` (a dict literal of wrappers)."""
    keys = storage_keys(recv, fn)[:1]
    if keys and keys[0] in built:
        return keys
    if isinstance(recv, ast.Subscript) and isinstance(recv.slice, ast.Constant):
        outer = storage_keys(recv.value, fn)[:1]
        if outer and outer[0] in built:
            return outer
    return keys or _local_key(recv, fn, built)


def _local_key(recv: ast.expr, fn: FunctionInfo, built: dict[Key, list[Built]]) -> list[Key]:
    """``w = BatchDecodeWithPagedKVCacheWrapper(...); w.run(...)`` inside one function."""
    if isinstance(recv, ast.Name):
        key = ("local", fn.qualname, recv.id)
        return [key] if key in built else []
    return []


def _constructor_calls(value: ast.expr) -> list[ast.Call]:
    if isinstance(value, ast.Call):
        return [value]
    if isinstance(value, ast.List | ast.Tuple):
        return [c for e in value.elts for c in _constructor_calls(e)]
    if isinstance(value, ast.ListComp):
        return _constructor_calls(value.elt)
    if isinstance(value, ast.DictComp):
        return _constructor_calls(value.value)
    if isinstance(value, ast.Dict):
        return [c for e in value.values for c in _constructor_calls(e)]
    return []
