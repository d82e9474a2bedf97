"""FC101 host-sync-in-hot-path: a host sync or device-to-host copy reachable from a per-step or capture root."""

from __future__ import annotations

import ast

from flashcheck.findings import Confidence
from flashcheck.verifier.astutil import dotted, name_tokens
from flashcheck.verifier.engine import Context, Rule, rule
from flashcheck.verifier.hotpath import Hop, HotPaths, RootKind
from flashcheck.verifier.project import FunctionInfo
from flashcheck.verifier.provenance import Where

_D2H_METHODS = frozenset({"item", "tolist", "cpu"})
_SYNC_FUNCS = frozenset({"torch.cuda.synchronize", "cuda.synchronize", "torch.cuda.current_stream.synchronize"})
_NONZERO_FUNCS = frozenset({"torch.nonzero", "torch.argwhere", "torch.masked_select", "torch.where"})
_CASTS = frozenset({"int", "float", "bool"})


def snippet(node: ast.AST, limit: int = 70) -> str:
    text = ast.unparse(node)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@rule("FC101", "host-sync-in-hot-path")
class HostSyncInHotPath(Rule):
    """A host sync or device-to-host copy runs on a hot path (every step, before every replay, or in capture).

    What it checks
        Code reachable from a hot-path root (per-step metadata build, graph replay preparation, plan wrappers,
        graph capture; see ``docs/static.md``) that calls ``.item()``, ``.tolist()``, ``.cpu()``, ``.to("cpu")``,
        ``.numpy()`` on a device tensor, ``torch.cuda.synchronize()``, a stream or event ``synchronize()``,
        ``nonzero``/``argwhere``/``masked_select``/one-argument ``torch.where``, boolean-mask indexing, ``int()``/
        ``float()``/``bool()`` of a device tensor, or branches on a device tensor (``if t:``, ``if (t > 0).any():``).
        Host data is not reported: ``*_cpu``/``*_host``/``*_np`` names, pinned buffers, numpy arrays, factories
        with ``device="cpu"`` or without a device, results of ``.cpu()``/``.numpy()``/``.tolist()``. On capture
        paths explicit ``synchronize()`` calls are allowed (they sit around the capture, not inside it).

    Why it breaks serving
        Each of these blocks the CPU until the GPU has drained its queue. On a path that runs before every replay it
        serialises CPU preparation with GPU execution and erases the benefit of CUDA graphs (rtp-llm PR 1099:
        ``qo_indptr.to("cpu").tolist()`` in ``prepare_cuda_graph``). During capture it either fails
        (``cudaErrorStreamCaptureUnsupported``) or bakes a capture-time value into the graph.

    Example
        ::

            def prepare_cuda_graph(self, attn_inputs):
                qo_indptr = attn_inputs.cu_seqlens.to(self.device)
                total = qo_indptr[-1].item()                      # FC101: sync before every replay

    Use instead
        Read the host mirror the engine already keeps (``attn_inputs.cu_seqlens_cpu``, vLLM's
        ``query_start_loc_cpu``), compute sizes on the host before the step, or keep the value on the device.

    Known false positives
        A tensor whose provenance the analysis cannot see (a parameter named ``seq_lens`` that is in fact on the CPU)
        is reported with medium confidence; name it ``*_cpu`` or add its name pattern to ``host-names``. Code that
        runs on a hot path only under a debug flag is reported; suppress it with a reason.
    """

    def check(self, ctx: Context) -> None:
        step = ctx.hot.reach("step")
        for fn in step:
            self._check_fn(ctx, fn, step, "step")
        capture = ctx.hot.reach("capture")
        for fn in capture:
            if fn not in step:
                self._check_fn(ctx, fn, capture, "capture")

    def _check_fn(self, ctx: Context, fn: FunctionInfo, reach: dict[FunctionInfo, Hop], kind: RootKind) -> None:
        def hit(node: ast.AST, what: str, where: Where) -> None:
            root = reach[fn].root
            when = "before every step or replay" if kind == "step" else "while CUDA graphs are captured"
            ctx.report(
                self,
                fn,
                node,
                f"`{snippet(node)}` {what} in {fn.short}, which runs {when} (root {root.fn.short}: {root.why})",
                hint="use the host mirror (*_cpu / pinned buffer) or compute the value on the host before the "
                "step; keep device values on the device",
                chain=HotPaths.chain(fn, reach),
                evidence={"root": root.fn.qualname, "root_kind": kind, "operand": where.value},
                confidence=Confidence.HIGH if where is Where.DEVICE else Confidence.MEDIUM,
            )

        prov = ctx.prov
        for call in fn.calls:
            name = dotted(call.func)
            func = call.func
            if name in _SYNC_FUNCS or (isinstance(func, ast.Attribute) and func.attr == "synchronize"):
                if kind == "step":
                    hit(call, "blocks the host until the GPU is idle", Where.DEVICE)
                continue
            if name in _NONZERO_FUNCS and call.args:
                if name == "torch.where" and len(call.args) != 1:
                    continue
                w = prov.of(call.args[0], fn)
                if w is not Where.HOST:
                    hit(call, "has a data-dependent output size (device-to-host sync)", w)
                continue
            if name in _CASTS and len(call.args) == 1:
                w = ctx.strict.of(call.args[0], fn)
                if w is Where.DEVICE:
                    hit(call, "reads a device tensor on the host", w)
                continue
            if not isinstance(func, ast.Attribute):
                continue
            method = func.attr
            if method in _D2H_METHODS or method in ("numpy", "nonzero", "to"):
                if method == "to" and prov.device_arg(call) is not Where.HOST and not _to_cpu_positional(call, ctx):
                    continue
                w = prov.of(func.value, fn)
                if w is Where.HOST or (method == "numpy" and w is not Where.DEVICE):
                    continue
                what = (
                    "has a data-dependent output size (device-to-host sync)"
                    if method == "nonzero"
                    else "copies device data to the host"
                )
                hit(call, what, w)
        for test in fn.tests:
            for leaf in _leaves(test):
                w = ctx.strict.of(leaf, fn)
                if w is Where.DEVICE and not isinstance(leaf, ast.Constant):
                    hit(leaf, "branches on a device tensor (implicit .item())", w)
        for sub in fn.subscripts:
            if isinstance(sub.ctx, ast.Load) and _is_mask(sub.slice, fn):
                w = prov.of(sub.value, fn)
                if w is not Where.HOST and prov.of(sub.slice, fn) is not Where.HOST:
                    hit(sub, "indexes with a boolean mask (data-dependent size, device-to-host sync)", w)


def _to_cpu_positional(call: ast.Call, ctx: Context) -> bool:
    """``.to("cpu")``, ``.to(torch.device("cpu"))``, ``.to(cpu_device)`` (but not ``.to(torch.int32)``)."""
    for a in call.args:
        d = dotted(a)
        if d is not None and d.startswith("torch."):
            continue
        if ctx.prov.device_value(a) is Where.HOST:
            return True
    return False


def _leaves(test: ast.expr) -> list[ast.expr]:
    if isinstance(test, ast.BoolOp):
        return [leaf for v in test.values for leaf in _leaves(v)]
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _leaves(test.operand)
    return [test]


def _is_mask(index: ast.expr, fn: FunctionInfo, depth: int = 0) -> bool:
    """A boolean index: a comparison, or a local named ``*mask*`` or assigned only from comparisons."""
    if isinstance(index, ast.Compare):
        return not all(isinstance(op, ast.Is | ast.IsNot | ast.In | ast.NotIn) for op in index.ops)
    if isinstance(index, ast.Name) and depth < 4:
        if "mask" in name_tokens(index.id):
            return True
        values = fn.local_assigns.get(index.id, [])
        return bool(values) and all(_is_mask(v, fn, depth + 1) for v in values)
    return False
