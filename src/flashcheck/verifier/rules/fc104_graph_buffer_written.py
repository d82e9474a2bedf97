"""FC104 graph-buffer-written-elsewhere: a buffer bound to a graph-mode wrapper is written outside metadata prep."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from flashcheck.verifier.astutil import is_in_place_method, kwarg
from flashcheck.verifier.dataflow import Key, storage_keys
from flashcheck.verifier.engine import Context, Rule, rule
from flashcheck.verifier.flashinfer_api import graph_mode, wrapper_buffer_args, wrapper_class_of_call
from flashcheck.verifier.hotpath import METADATA_CATEGORIES
from flashcheck.verifier.project import FunctionInfo
from flashcheck.verifier.rules.fc101_host_sync import snippet


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
        Tensors (or views of them) passed as persistent buffers to a FlashInfer wrapper built with
        ``use_cuda_graph=True`` (``paged_kv_indptr_buffer=``, ``paged_kv_indices_buffer=``, ``qo_indptr_buf=``, a
        ``CUDAGraph*Wrapper``'s buffers...), tracked through slices, views and local aliases to ``self.<attr>`` or
        a module global; then every in-place write of the same storage (``buf[...] = ...``, ``buf.copy_()``,
        ``buf.fill_()``, ``out=buf``, ``buf += ...``) in a function that is neither the binding function, nor an
        initialiser (``__init__``, ``init_*``), nor reachable from a replay / metadata / plan root.

    Why it breaks serving
        A graph-mode wrapper does not copy these buffers: ``plan()`` before each replay reads and fills them and the
        captured kernels read them by address. Code elsewhere that reuses the storage for its own purposes (an SGLang
        fork: the sparse forward rewrote the shared ``kv_indptr`` inside the captured graph) leaves values
        that the next ``plan()`` reads as its input, and after minutes of serving replay fails with a non-monotone
        ``kv_indptr`` or, worse, reads another request's KV.

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
        object) are reported; add the helper to ``hot-paths`` or suppress with a reason. Storage reached through
        other objects than ``self`` or a module global is not tracked (false negatives).
    """

    def check(self, ctx: Context) -> None:
        bindings: dict[Key, Binding] = {}
        for fn in ctx.project.all_functions():
            for call in fn.calls:
                cls_name = wrapper_class_of_call(call, fn)
                if cls_name is None or graph_mode(call, cls_name) is not True:
                    continue
                for param, expr in wrapper_buffer_args(call, cls_name):
                    for key in storage_keys(expr, fn)[:1]:
                        bindings.setdefault(key, Binding(fn, call, param, cls_name))
        if not bindings:
            return
        prep = ctx.hot.reach_categories(METADATA_CATEGORIES)
        binders = {id(b.fn) for b in bindings.values()}
        for fn in ctx.project.all_functions():
            if (
                fn in prep
                or id(fn) in binders
                or fn.name in ("__init__", "__post_init__")
                or fn.name.startswith("init_")
            ):
                continue
            for node, target in _writes(fn):
                for key in storage_keys(target, fn):
                    b = bindings.get(key)
                    if b is None:
                        continue
                    sf = b.fn.source
                    ctx.report(
                        self,
                        fn,
                        node,
                        f"`{snippet(node)}` writes `{key[2]}`, which is bound as {b.param} of a graph-mode "
                        f"{b.wrapper} in {b.fn.short} ({sf.relpath}:{b.call.lineno}); {fn.short} is not on a "
                        "replay/metadata path, so the next plan() reads what it left",
                        hint="give this code its own buffer, or restore the precomputed contents before plan()",
                        evidence={
                            "buffer": key[2],
                            "bound_at": f"{sf.relpath}:{b.call.lineno}",
                            "bound_in": b.fn.qualname,
                            "parameter": b.param,
                        },
                    )
                    break


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
        if isinstance(call.func, ast.Attribute) and is_in_place_method(call.func.attr):
            out.append((call, call.func.value))
        o = kwarg(call, "out")
        if o is not None:
            out.append((call, o))
    return out
