"""FC101 host-sync-in-hot-path: a host sync or device-to-host copy reachable from a per-step or capture root."""

from __future__ import annotations

import ast
from collections.abc import Callable

from flashcheck.findings import Confidence
from flashcheck.verifier.astutil import dotted, kwarg, name_tokens, storage_root, terminal_name
from flashcheck.verifier.engine import Context, Rule, rule
from flashcheck.verifier.hotpath import Hop, HotPaths, RootKind
from flashcheck.verifier.operator_idioms import as_written
from flashcheck.verifier.project import FunctionInfo, imported_name, torch_name
from flashcheck.verifier.provenance import Provenance, Where
from flashcheck.verifier.provenance.context import in_context
from flashcheck.verifier.provenance.tensors import TENSOR_METHODS
from flashcheck.verifier.syntax_reads import comprehension_ifs, formatted_values, membership_tests

_D2H_METHODS = frozenset({"item", "tolist", "cpu"})
_SYNC_FUNCS = frozenset({"torch.cuda.synchronize", "cuda.synchronize", "torch.cuda.current_stream.synchronize"})
_NONZERO_FUNCS = frozenset(
    {
        "torch.nonzero",
        "torch.argwhere",
        "torch.masked_select",
        "torch.where",
        "torch.unique",
        "torch.unique_consecutive",
        "torch.repeat_interleave",
    }
)
_NONZERO_METHODS = frozenset({"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive"})
_COMPARES = frozenset({"torch.equal", "torch.allclose"})
_MASK_METHODS = frozenset(
    {"isnan", "isinf", "isfinite", "isin", "isclose", "logical_not", "logical_and", "logical_or", "logical_xor"}
    | {"eq", "ne", "lt", "le", "gt", "ge", "bool"}
)
_CASTS = frozenset({"int", "float", "bool"})
_NUMERIC_READS = frozenset({"math.ceil", "math.floor", "math.trunc", "round", "range", "operator.index"})
_REDUCERS = frozenset({"max", "min", "sum", "any", "all", "sorted"})
_PACKERS = {"struct.pack": 1, "struct.pack_into": 3}  # the arguments before the packed values
_HOST_READS = frozenset({"tolist", "item", "numpy", "max", "min", "sum", "any", "all", "argmax", "mean", "__getitem__"})


def _sized_by_data(call: ast.Call) -> bool:
    """Whether ``torch.repeat_interleave(...)`` sizes its output by tensor data: no ``output_size=`` and the repeats
    (the second argument, ``repeats=``, or the only one) are not a constant."""
    if any(kw.arg == "output_size" for kw in call.keywords):
        return False
    repeats = _repeats(call)
    return not (isinstance(repeats, ast.Constant) and isinstance(repeats.value, int))


def _repeats(call: ast.Call) -> ast.expr:
    """The repeats of ``torch.repeat_interleave(...)``: ``repeats=``, the second argument, or the only one. They size
    the output, so they decide the sync, not the input."""
    repeats = next((kw.value for kw in call.keywords if kw.arg == "repeats"), None)
    return repeats if repeats is not None else (call.args[1] if len(call.args) > 1 else call.args[0])


def snippet(node: ast.AST, limit: int = 70) -> str:
    """`node` as written (`as_written`), cut to `limit` characters."""
    text = as_written(node)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@rule("FC101", "host-sync-in-hot-path")
class HostSyncInHotPath(Rule):
    """A host sync or device-to-host copy runs on a hot path (every step, before every replay, or in capture).

    What it checks
        Code reachable from a hot-path root (per-step metadata build, graph replay preparation, plan wrappers, graph
        capture; see ``docs/static.md``) that calls ``.item()``, ``.tolist()``, ``.cpu()``, ``.to("cpu")``,
        ``.numpy()``, ``.type_as(host_tensor)`` on a device tensor, ``torch.cuda.synchronize()`` (also imported under
        another name), a stream or event ``synchronize()``,
        ``nonzero``/``argwhere``/``masked_select``/``unique``/``unique_consecutive``/one-argument ``torch.where``
        (functions and methods), ``torch.repeat_interleave`` with tensor repeats and no ``output_size=``,
        ``torch.equal``/``torch.allclose``, boolean-mask indexing (a comparison, its ``~``/``&``/``|``, a predicate such
        as ``isnan()`` or ``any(dim)``, a name assigned one; in any dimension: ``q[:, is_ret]``; a store through one
        of a tensor of values, ``x[mask] = y``, or beside a tensor index, ``logits[done, cols] = x``, but not of a
        scalar through the mask and plain indices or slices, ``logits[done, eos] = float("-inf")``, which runs on the
        device),
        ``int()``/``float()``/``bool()`` of a device tensor (also per element in a comprehension) and
        ``math.ceil``/``math.floor``/``round``/``range`` of one, builtin ``max``/``min``/``sum``/``any``/``all`` over a
        device tensor, a device scalar as a slice bound (in any dimension: ``t[:b, :n]``), ``host.copy_(device)``
        without ``non_blocking=True``, a host read of a ``non_blocking`` device-to-host copy before any event or stream
        sync (also one handed to a call that runs it: ``await loop.run_in_executor(pool, done.synchronize)``), branches,
        asserts and comprehension conditions on a device tensor (``if t:``, ``if (t > 0).any():``, ``assert t.all()``,
        ``[i for i in ids if t[i] > 0]``), a membership test in a device tensor (``tok in t``; in a condition, an
        assigned value or a return), ``struct.pack`` of a device value, and a device tensor formatted as text
        (``f"{t}"``, ``str(t)``, ``print(t)``, ``"%d" % t``; not in ``raise`` statements or assert messages).
        Reachability includes ``@property`` getters the hot path runs by reading the attribute
        (``self.num_sequences``, ``info.sequence_lengths`` on an object whose class is known) and methods called
        through an attribute that holds them (``self.update = self.update_single_wrapper``). Device-ness follows the
        project's value flow (callers' arguments, other objects' attributes and dataclass fields, also fields set after
        construction (``ret = cls(...); ret.seq_lens = ...``) and fields of objects that project functions return, built
        by keyword or position, ``@property`` results, return values, ``with torch.device(...)``, module globals that a
        function assigns after ``global X``; a tensor allocated on a ``torch.device`` object lives where the object
        names, also when a helper allocates on its ``device`` parameter: ``allocate(n, self.host_dev)``). A class
        inherits the methods of a generic base (``MetadataBuilder[FlashInferMetadata]``), and an object declared with a
        ``typing.Protocol`` runs the methods of the classes that implement it. Host data is not reported:
        ``*_cpu``/``*_host``/``*_np`` names (of a name with a host and a device word, the last one decides:
        ``max_host_len_dev`` is device data), pinned buffers, numpy arrays, factories with ``device="cpu"`` or without a
        device, results of ``.cpu()``/``.numpy()``/``.tolist()``. On capture paths explicit ``synchronize()`` calls are
        allowed (they sit around the capture, not inside it). A function that is itself a capture root (by
        ``capture-paths`` or the default ``capture`` pattern) is judged as capture code even when a per-step root also
        calls it (a ``forward`` that captures each new batch size on first sight): its device-to-host reads are
        reported, its ``synchronize()`` calls are not; the functions it calls keep the per-step judgement when a
        per-step root reaches them.

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
        A tensor whose provenance the analysis cannot see (a parameter named ``seq_lens`` that is in fact on the CPU) is
        reported with medium confidence; name it ``*_cpu`` or add its name pattern to ``host-names``. Code that runs on
        a hot path only under a debug flag is reported; suppress it with a reason. A cast, builtin reduction, slice
        bound, branch, comparison (``torch.equal``) or copy into host memory (``host.copy_(x)``) on a value that is
        certainly a tensor but whose device no project code decides (a parameter or field declared ``torch.Tensor`` that
        only callers outside the project fill, a name the function uses as a tensor: a tensor-only method called on it,
        or passed as the tensor operand of a torch operation or ``copy_``; the result of a project function or
        ``@property`` annotated ``-> torch.Tensor``; an attribute assigned from a torch op; a torch op or tensor method
        over one, arithmetic with one, its elements) is reported with low confidence. A capture root that also runs
        eager warm-up steps (vLLM's ``_warmup_and_capture`` calling ``_dummy_run``) makes everything those steps call
        capture code: a read in the warm-up's input preparation (a dummy multimodal batch) is reported as if captured;
        name the function that captures in ``capture-paths`` and turn the default roots off, or suppress with a reason.
        Objects of a compiled extension (rtp-llm's attention inputs) have no Python class: their fields are judged by
        the stores of attributes of that name elsewhere in the project, and a host field can read as a device one,
        unless the project also reads the field's device copy (``prefix_lengths_device``, ``*_gpu``, ``*_cuda``), which
        makes the bare name the host mirror, or reads a ``<x>_d`` twin of an ``<x>_h`` field, which makes that field the
        host copy. An object a
        configuration's factory picks (``self.quant_method = quant_config.get_quant_method(self, prefix)``) runs, for
        a method its declared base only declares, the methods of the classes the factory's overrides return for that
        layer; where one return is beyond the analysis (a plugin loader, a class read from a table), every override
        counts, also one no layer of that kind gets (an MoE method's ``apply`` for a linear layer). A helper's read
        of its parameters is judged with the calls that reach it on the hot path: one that every hot caller hands a
        host mirror is quiet whatever code off the hot path passes
        (through nested project helpers and library functions of host values, ``triton.cdiv(prepare_lens(cu), n)``), but
        one that a hot caller hands a device tensor, or a value of unknown place, is reported. A base class's method
        that the accelerator subclasses override but a CPU platform's subclass inherits is judged with the tensors of
        the other platforms. An ``event.synchronize()`` before each plan that waits for an event recorded right after
        the previous plan (guarding a reused pinned staging buffer) is reported, though it only bounds how far the host
        runs ahead; suppress it with that reason. An attribute declared with a ``typing.Protocol`` runs what every store
        of that attribute name builds, also a store on another class's object (``worker.sink = DeviceRingSink(n)`` in
        another component) when the analysis cannot tell the stores apart.

    What it cannot see
        Syncs inside C++ extensions or in code outside the checked paths, device values that enter from outside the
        project (an unannotated argument no project code passes), lazy logging arguments (``logger.debug("%s", t)``,
        formatted only when the level is enabled), properties read from objects whose class the analysis cannot tell (or
        through ``getattr``; objects project functions return and items project generators yield are typed by
        annotations and constructors), syncs in a lambda handed to a call as a keyword argument other than ``key=``
        (taken for a callback run later), overrides below a generic base (``Processor[T]``) reached through an object
        known only as that base (a framework's dozens of host-side implementations would all count), and hot paths no
        root reaches (configure ``hot-paths``). Code in a branch that
        every path to its function rules out with a constant argument (``if not skip_eplb:`` when every call passes
        ``skip_eplb=True``; ``docs/static.md``) is not checked.
    """

    def check(self, ctx: Context) -> None:
        # A capture root is capture code even where a per-step root also reaches it (an engine's forward that
        # captures a batch size on first sight): its synchronize() calls sit around the capture it makes.
        # (one that captures inline is judged as step code outside its capture blocks: `HotPaths.around_capture`)
        capture_roots = {r.fn for r in ctx.hot.roots if r.kind == "capture" and r.outside is None}
        step = ctx.hot.reach("step")
        for fn in step:
            if fn not in capture_roots:
                self._check_fn(ctx, fn, step, "step")
        capture = ctx.hot.reach("capture")
        for fn in capture:
            # judged as step code where a step path runs it; as capture code where only the capture does
            self._check_fn(ctx, fn, capture, "capture", also_step=fn in step and fn not in capture_roots)

    def _check_fn(
        self, ctx: Context, fn: FunctionInfo, reach: dict[FunctionInfo, Hop], kind: RootKind, also_step: bool = False
    ) -> None:
        stored = {id(n) for lam in _stored_lambdas(fn) for n in ast.walk(lam.body)}

        def hit(
            node: ast.AST,
            what: str,
            where: Where,
            confidence: Confidence | None = None,
            operand: ast.expr | None = None,
        ) -> None:
            if id(node) in stored:
                return  # the body of a callback handed over to be run later, not here
            stepped = also_step and ctx.hot.live(fn, node, "step") and not ctx.hot.around_capture(fn, node, sync=False)
            if not ctx.hot.live(fn, node, kind) or stepped:
                return  # a branch every path here rules out with a constant argument, or reported as step code
            if kind == "step" and ctx.hot.around_capture(fn, node, sync=False):
                return  # captured inline: judged as capture code
            if operand is not None and _host_in_hot_calls(ctx, fn, operand, reach):
                return  # a helper every hot caller hands host data (other callers' device tensors run elsewhere)
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
                confidence=confidence or (Confidence.HIGH if where is Where.DEVICE else Confidence.MEDIUM),
            )

        prov, strict = ctx.prov, ctx.strict

        def host_read(expr: ast.expr, what: str, node: ast.AST) -> None:
            """Report a host read of `expr` (cast, builtin reduction): device facts high, tensors of unknown
            device low."""
            w = strict.of(expr, fn)
            if w is Where.DEVICE:
                hit(node, what, w, operand=expr)
            elif w is Where.UNKNOWN and prov.tensorish(expr, fn) and prov.tensor_where(expr, fn) is not Where.HOST:
                unsure = (
                    what.replace("a device tensor", "a tensor of unknown device") + " (a sync if it is on the device)"
                )
                hit(node, unsure, w, Confidence.LOW)

        pending = _pending_copies(fn, prov)
        for call in fn.calls:
            name = torch_name(call.func, fn)
            func = call.func
            if name in _SYNC_FUNCS or (isinstance(func, ast.Attribute) and func.attr == "synchronize"):
                if kind == "step" and not ctx.hot.around_capture(fn, call, sync=True):  # not the one beside a capture
                    hit(call, "blocks the host until the GPU is idle", Where.DEVICE)
                continue
            if name in _NONZERO_FUNCS and call.args:
                if name == "torch.where" and len(call.args) != 1:
                    continue
                if name == "torch.repeat_interleave" and not _sized_by_data(call):
                    continue  # output_size= given, or a constant repeat count: the size is known on the host
                w = prov.of(_repeats(call) if name == "torch.repeat_interleave" else call.args[0], fn)
                if w is not Where.HOST:
                    hit(call, "has a data-dependent output size (device-to-host sync)", w)
                continue
            if name in _COMPARES:
                operands = [*call.args[:2], *(k.value for k in call.keywords if k.arg in ("input", "other"))]
                ws = [prov.of(a, fn) for a in operands]
                if Where.DEVICE in ws:
                    operand = operands[ws.index(Where.DEVICE)]
                    hit(call, "compares tensors on the host (device-to-host sync)", Where.DEVICE, operand=operand)
                elif Where.HOST not in ws:  # torch.equal(out, warm) of tensors no project code places
                    unplaced = [a for a in operands if prov.tensorish(a, fn)]
                    if unplaced:
                        host_read(unplaced[0], "compares a device tensor on the host", call)
                continue
            if name in _CASTS and len(call.args) == 1:
                host_read(call.args[0], "reads a device tensor on the host", call)
                continue
            if name in _NUMERIC_READS and call.args:  # math.ceil(t / bs), round(t), range(t): __float__/__index__
                for a in call.args[:3]:
                    host_read(a, "reads a device tensor on the host", call)
                continue
            packer = imported_name(func, fn, "struct")  # struct.pack, also pack after from struct import pack
            if packer in _PACKERS:  # struct.pack("<q", tok): each value's __index__ / __float__
                for a in call.args[_PACKERS[packer] :]:
                    host_read(a, "packs a device tensor into bytes (reads it on the host)", call)
                continue
            if name in _REDUCERS and len(call.args) == 1 and not call.keywords:
                host_read(call.args[0], "iterates a device tensor on the host (one sync per element)", call)
                continue
            if not isinstance(func, ast.Attribute):
                continue
            method = func.attr
            if method == "copy_" and call.args and not _non_blocking(call):
                if prov.of(func.value, fn) is Where.HOST:  # into host memory: from a device or unknown tensor
                    host_read(call.args[0], "copies a device tensor into host memory (blocking)", call)
                continue
            if method in _D2H_METHODS or method in ("numpy", "to", "type_as") or method in _NONZERO_METHODS:
                if (
                    method == "to"
                    and prov.device_arg(call, fn) is not Where.HOST
                    and not _cpu_positional(call, prov, fn)
                ):
                    continue
                if method == "type_as" and not (call.args and prov.of(call.args[0], fn) is Where.HOST):
                    continue  # dev.type_as(host_tensor) copies to the host; to another device tensor it does not
                if method in ("to", "cpu") and _non_blocking(call):
                    continue  # asynchronous; a host read before an event sync is reported below
                w = prov.of(func.value, fn)
                if w is Where.HOST or (method == "numpy" and w is not Where.DEVICE):
                    continue
                if method == "type_as" and w is not Where.DEVICE and not _tensor_result(func.value, prov, fn):
                    continue  # x.type_as(host) of a value of unknown place and kind: mostly a dtype cast
                what = (
                    "has a data-dependent output size (device-to-host sync)"
                    if method in _NONZERO_METHODS
                    else "copies device data to the host"
                )
                hit(call, what, w, operand=func.value)
        for value, node in formatted_values(fn):
            host_read(value, "formats a device tensor as text (copies it to the host)", node)
        for n in membership_tests(fn):  # tok in next_ids: Tensor.__contains__ reads (next_ids == tok).any() back
            for op, right in zip(n.ops, n.comparators, strict=True):
                if isinstance(op, ast.In | ast.NotIn):
                    host_read(right, "tests membership in a device tensor (reads the comparison on the host)", n)
        for line, text, use in _early_reads(fn, pending):
            hit(
                use,
                f"reads `{text}`, filled by a non_blocking device-to-host copy on line {line}, before any event "
                "or stream sync (the host may see stale data)",
                Where.DEVICE,
            )
        for test in [*fn.tests, *(a.test for a in fn.asserts), *comprehension_ifs(fn)]:  # asserts evaluate too
            for leaf in _leaves(test):
                if isinstance(leaf, ast.Constant):
                    continue
                w = strict.of(leaf, fn)
                if w is Where.DEVICE:
                    hit(leaf, "branches on a device tensor (implicit .item())", w)
                elif w is Where.UNKNOWN and prov.tensorish(leaf, fn) and prov.tensor_where(leaf, fn) is not Where.HOST:
                    hit(leaf, "branches on a tensor (implicit .item() if it is on the device)", w, Confidence.LOW)
        assigned = {id(t): a.value for a in fn.assigns if isinstance(a, ast.Assign) for t in a.targets}
        masked: set[tuple[int, str]] = set()  # x[m] = x[m] * 2: one finding, for the read
        for sub in sorted(fn.subscripts, key=lambda s: isinstance(s.ctx, ast.Store)):  # reads first
            load = isinstance(sub.ctx, ast.Load) or _mask_store_syncs(sub, assigned.get(id(sub)), fn, prov)
            at = (sub.lineno, ast.unparse(sub))
            masks = _masks(sub.slice, fn) if load and at not in masked else []
            if masks:
                w = prov.of(sub.value, fn)
                if w is not Where.HOST and any(prov.of(m, fn) is not Where.HOST for m in masks):
                    hit(sub, "indexes with a boolean mask (data-dependent size, device-to-host sync)", w)
                    masked.add(at)
            else:
                _slice_bounds(sub, fn, prov, strict, hit)


def _slice_bounds(
    sub: ast.Subscript,
    fn: FunctionInfo,
    prov: Provenance,
    strict: Provenance,
    hit: Callable[[ast.AST, str, Where, Confidence | None], None],
) -> None:
    """A device scalar as a slice bound, in any dimension (``t[:n]``, ``t[:b, :n]``): high confidence on device
    facts, low for a tensor of unknown device."""
    dims = sub.slice.elts if isinstance(sub.slice, ast.Tuple) else [sub.slice]
    for dim in dims:
        if not isinstance(dim, ast.Slice):
            continue
        for bound in (dim.lower, dim.upper, dim.step):
            if bound is None:
                continue
            w = strict.of(bound, fn)
            if w is Where.DEVICE:
                hit(sub, "uses a device scalar as a slice bound (implicit .item())", w, None)
                return
            if w is Where.UNKNOWN and prov.tensorish(bound, fn) and prov.tensor_where(bound, fn) is not Where.HOST:
                hit(sub, "uses a tensor as a slice bound (implicit .item() if it is on the device)", w, Confidence.LOW)
                return


def _non_blocking(call: ast.Call) -> bool:
    v = kwarg(call, "non_blocking")
    return isinstance(v, ast.Constant) and v.value is True


def _pending_copies(fn: FunctionInfo, prov: Provenance) -> list[tuple[int, str]]:
    """(line, host value) of non_blocking device-to-host copies: ``h = d.to("cpu", non_blocking=True)``,
    ``h.copy_(d, non_blocking=True)``."""
    out: list[tuple[int, str]] = []
    for a in fn.assigns:
        v = a.value
        if (
            isinstance(a, ast.Assign)
            and isinstance(v, ast.Call)
            and isinstance(v.func, ast.Attribute)
            and v.func.attr in ("to", "cpu")
            and _non_blocking(v)
            and (v.func.attr == "cpu" or prov.device_arg(v, fn) is Where.HOST or _cpu_positional(v, prov, fn))
        ):
            out.extend((a.lineno, ast.unparse(t)) for t in a.targets if isinstance(t, ast.Name | ast.Attribute))
    for call in fn.calls:
        f = call.func
        if (
            isinstance(f, ast.Attribute)
            and f.attr == "copy_"
            and call.args
            and _non_blocking(call)
            and prov.of(f.value, fn) is Where.HOST
            and prov.of(call.args[0], fn) is not Where.HOST
        ):
            out.append((call.lineno, ast.unparse(storage_root(f.value))))
    return out


def _cpu_positional(call: ast.Call, prov: Provenance, fn: FunctionInfo) -> bool:
    """``.to("cpu")``, ``.to(torch.device("cpu"))``, ``.to(cpu_device)``, ``.to(here)`` with ``here = "cpu"`` (but not
    ``.to(torch.int32)``)."""
    return any(prov.device_value(a, fn) is Where.HOST for a in call.args if not (dotted(a) or "").startswith("torch."))


_RUNNERS = frozenset({"run_in_executor", "to_thread", "submit", "call_soon", "call_soon_threadsafe", "apply_async"})


def _early_reads(fn: FunctionInfo, pending: list[tuple[int, str]]) -> list[tuple[int, str, ast.Call]]:
    """The first host read of each pending copy's value that no sync (``synchronize``/``wait``, also handed to a
    call that runs it: ``await loop.run_in_executor(pool, done.synchronize)``, ``asyncio.to_thread(ev.wait)``)
    precedes."""
    if not pending:
        return []
    waits = ("synchronize", "wait", "wait_event", "query")
    syncs = [
        c.lineno
        for c in fn.calls
        if (isinstance(c.func, ast.Attribute) and c.func.attr in waits)
        or (
            terminal_name(c.func) in _RUNNERS
            and any(isinstance(a, ast.Attribute) and a.attr in waits[:3] for a in c.args)
        )
    ]
    out: list[tuple[int, str, ast.Call]] = []
    for line, text in pending:
        for call in sorted(fn.calls, key=lambda c: (c.lineno, c.col_offset)):
            if call.lineno <= line or any(line < s <= call.lineno for s in syncs):
                continue
            f = call.func
            if isinstance(f, ast.Name) and f.id in _CASTS | _REDUCERS | {"list"}:
                read = call.args[0] if call.args else None
            elif isinstance(f, ast.Attribute) and f.attr in _HOST_READS:
                read = f.value
            else:
                continue
            if read is not None and any(
                isinstance(n, ast.Name | ast.Attribute) and ast.unparse(n) == text for n in ast.walk(read)
            ):
                out.append((line, text, call))
                break
    return out


def _leaves(test: ast.expr) -> list[ast.expr]:
    if isinstance(test, ast.BoolOp):
        return [leaf for v in test.values for leaf in _leaves(v)]
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _leaves(test.operand)
    return [test]


def _mask_store_syncs(sub: ast.Subscript, value: ast.expr | None, fn: FunctionInfo, prov: Provenance) -> bool:
    """Whether a store through a mask index needs the mask's positions on the host: a tensor of values (``x[mask]
    = y``: as many values as the mask selects), or a tensor index beside the mask (``x[mask, cols] = v``); a scalar
    through the mask and plain indices or slices (``x[mask] = -inf``, ``x[mask, eos] = 0.0``) runs on the device."""
    if not isinstance(sub.ctx, ast.Store) or value is None:
        return False
    if prov.tensorish(value, fn):
        return True
    dims = sub.slice.elts if isinstance(sub.slice, ast.Tuple) else []
    return any(not isinstance(d, ast.Slice) and not _is_mask(d, fn) and prov.tensorish(d, fn) for d in dims)


def _masks(index: ast.expr, fn: FunctionInfo) -> list[ast.expr]:
    """The boolean masks of an index: itself, or the ones among the dimensions of ``q[:, is_ret]``."""
    if _is_mask(index, fn):
        return [index]
    dims = index.elts if isinstance(index, ast.Tuple) else []
    return [d for d in dims if not isinstance(d, ast.Slice) and _is_mask(d, fn)]


def _is_mask(index: ast.expr, fn: FunctionInfo, depth: int = 0) -> bool:
    """A boolean index: a comparison, its negation (``~m``) or combination (``a & b``), a tensor predicate
    (``x.isnan()``, ``m.any(-1)`` along a dimension, ``torch.isin(...)``), or a local named ``*mask*`` or assigned
    only from those."""
    if isinstance(index, ast.Compare):
        return not all(isinstance(op, ast.Is | ast.IsNot | ast.In | ast.NotIn) for op in index.ops)
    if depth >= 6:
        return False
    if isinstance(index, ast.UnaryOp) and isinstance(index.op, ast.Invert):
        return _is_mask(index.operand, fn, depth + 1)
    if isinstance(index, ast.BinOp) and isinstance(index.op, ast.BitAnd | ast.BitOr | ast.BitXor):
        return _is_mask(index.left, fn, depth + 1) or _is_mask(index.right, fn, depth + 1)
    if isinstance(index, ast.Call) and isinstance(index.func, ast.Attribute):
        method = index.func.attr
        if method in ("any", "all"):  # along a dimension: a boolean tensor (without one: a scalar)
            return bool(index.args or index.keywords)
        return method in _MASK_METHODS
    if isinstance(index, ast.Name) and depth < 4:
        if "mask" in name_tokens(index.id):
            return True
        values = fn.local_assigns.get(index.id, [])
        return bool(values) and all(_is_mask(v, fn, depth + 1) for v in values)
    return False


def _stored_lambdas(fn: FunctionInfo) -> list[ast.Lambda]:
    """Lambdas handed to a call as a keyword argument (``python_lambda=lambda x: x.item()``, a callback the callee
    keeps and runs later), except ``key=`` (``sorted``/``min``/``max`` run it at once)."""
    if isinstance(fn.node, ast.Module):
        return []
    return [
        kw.value
        for call in fn.calls
        for kw in call.keywords
        if isinstance(kw.value, ast.Lambda) and kw.arg not in (None, "key")
    ]


def _host_in_hot_calls(ctx: Context, fn: FunctionInfo, operand: ast.expr, reach: dict[FunctionInfo, Hop]) -> bool:
    """Whether `operand` is host data in every call that reaches `fn` on this hot path: a helper the hot path hands
    host mirrors (``prepare_chunk_indices(query_start_loc_cpu, ...)`` from a metadata builder) while other, cold
    callers hand it device tensors. Only for a function that is not itself a root and has hot callers."""
    if reach[fn].parent is None or ctx.project.used_as_value(fn) or not _reads_params(operand, fn):
        return False  # (a helper also handed on as a value, a partial or callback, may run with other arguments)
    callers = ctx.project.callers(fn)
    calls = [(caller, call) for caller, call in callers if caller in reach]
    if not calls or len(callers) >= 64:  # (callers() keeps 64: a hot call beyond them would not be asked)
        return False
    return all(in_context(ctx.prov, operand, fn, call, caller) is Where.HOST for caller, call in calls)


def _reads_params(expr: ast.expr, fn: FunctionInfo, depth: int = 0) -> bool:
    """Whether `expr` reads a parameter of `fn` other than ``self``/``cls``, directly or through its locals' values:
    only then can the calls that reach `fn` change where it lives."""
    for node in ast.walk(expr):
        if not isinstance(node, ast.Name) or node.id in ("self", "cls"):
            continue
        if node.id in fn.params:
            return True
        values = fn.local_assigns.get(node.id, []) if depth < 3 else []
        if any(_reads_params(v, fn, depth + 1) for v in values[:4]):
            return True
    return False


def _tensor_result(expr: ast.expr, prov: Provenance, fn: FunctionInfo) -> bool:
    """A tensor by the call that computes it: a tensor method's result (``logits.argmax(-1)``) or a torch
    operation's; a name or attribute of unknown place is not (``positions.type_as(lens_cpu)`` is mostly a cast)."""
    if not isinstance(expr, ast.Call):
        return False
    f = expr.func
    return (isinstance(f, ast.Attribute) and f.attr in TENSOR_METHODS) or prov.tensorish(expr, fn)
