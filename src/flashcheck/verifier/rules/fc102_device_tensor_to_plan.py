"""FC102 device-tensor-to-plan: a device tensor passed as indptr / last_page_len / seq_lens to a FlashInfer plan."""

from __future__ import annotations

import ast

from flashcheck.findings import Confidence
from flashcheck.verifier.astutil import dotted, name_tokens, terminal_name
from flashcheck.verifier.engine import Context, Rule, rule
from flashcheck.verifier.flashinfer_api import PLAN_METHODS, is_flashinfer_import, looks_like_wrapper
from flashcheck.verifier.project import FunctionInfo
from flashcheck.verifier.provenance import Where
from flashcheck.verifier.rules.fc101_host_sync import snippet


def _is_host_side_param(name: str) -> bool:
    words = name_tokens(name)
    return (
        "indptr" in words
        or {"last", "page", "len"} <= words
        or {"seq", "lens"} <= words
        or "seqlens" in words
        or {"kv", "lens"} <= words
        or {"kv", "len", "arr"} <= words
    )


# the plan() parameters FlashInfer copies to the host, by name (keys a spread dict may hold them under)
_HOST_SIDE_NAMES = (
    "indptr",
    "last_page_len",
    "qo_indptr",
    "paged_kv_indptr",
    "paged_kv_last_page_len",
    "kv_indptr",
    "kv_len_arr",
    "seq_lens",
    "kv_lens",
)


@rule("FC102", "device-tensor-to-plan")
class DeviceTensorToPlan(Rule):
    """A device tensor is passed as indptr, last_page_len or seq_lens to a FlashInfer ``plan()``.

    What it checks
        Calls of ``plan``, ``begin_forward``, ``fast_decode_plan`` (and ``fast_mla_decode_plan``) on a FlashInfer
        wrapper (also the persistent ``flashinfer.BatchAttention``, imported from flashinfer) whose indptr,
        ``last_page_len``, ``seq_lens``, ``kv_lens`` or ``kv_len_arr`` argument is known to live on the device: built
        with ``device="cuda"``/``device=self.device``, ``.cuda()``, ``.to(device)``, a slice of such a buffer, a
        caller's argument, dataclass field or list item that is one, or named ``*_gpu``/``*_cuda``/``*_device``. A
        wrapper is found by dataflow from its constructor (any receiver name: ``w``, ``decode``,
        ``self.wrappers["decode"]``, a list or dict item, a parameter, a field of an object a project function returns),
        also when built in a conditional expression (``None if graph else W(...)``, ``cached or W(...)``), by an
        annotation naming a wrapper class (a parameter, or a field declared ``Optional[W]``) or by a ``*wrapper*`` name;
        plan functions also through aliases (``self._plan_fn = fast_decode_plan``, ``functools.partial``), and a
        wrapper's bound ``plan`` through aliases too (``p = w.plan``, ``self._plan = self._wrapper.plan``,
        ``functools.partial(w.plan, ...)``). Positional arguments are matched to the wrapper family's plan signature
        (decode, prefill, MLA, cascade), shifted by the arguments a partial already binds; list arguments (cascade
        levels, also ``[t] * 2`` and a local list built with ``append``) are checked item by item, ``**kwargs`` from a
        dict literal or ``dict(...)`` key by key (also merged: ``base | {...}``, ``{**base, ...}``, ``ChainMap`` layers,
        a factory's dict, a copy filled by item stores, ``setdefault`` or ``update``, a comprehension that keeps some
        of another dict's items, ``{k: v for k, v in kw.items() if k in accepted}``; a builder's parameter holds what
        the call the walk came through passed, not every caller's), ``*args`` of a tuple or list
        literal (also a local bound once) in the positions it fills, and a dataclass handed over whole:
        ``**dataclasses.asdict(x)`` field by field (also a ``NamedTuple``'s ``**x._asdict()`` and ``**{f.name:
        getattr(x, f.name) for f in fields(x)}``) and ``*dataclasses.astuple(x)`` in field order, as the construction
        ``x`` is (returned by a method: ``meta.plan_args()``, built by ``cls(...)`` in a classmethod constructor, or a
        ``dataclasses.replace`` copy of one) filled them. The finding is on the call's first line.

    Why it breaks serving
        FlashInfer's planner runs on the CPU: it copies these arguments to the host with a blocking ``.to("cpu")``
        on every call, one device-to-host sync per wrapper per step. vLLM measured the cost in PR 21137 (six
        ``.cpu()`` transfers per build before, one after) and now passes its ``*_cpu`` mirrors.

    Example
        ::

            self.paged_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
            ...
            self.decode_wrapper.plan(self.paged_kv_indptr[: bs + 1], ...)   # FC102

    Use instead
        Keep a pinned host mirror (``torch.zeros(..., device="cpu", pin_memory=True)``), fill it with numpy on the
        host, pass the mirror to ``plan()`` and copy it to the device buffer with ``non_blocking=True`` if the
        kernel needs it there.

    Known false positives
        A ``plan`` method of an engine class that is not FlashInfer's, called on a receiver named ``*wrapper*``, is
        reported unless the receiver is seen built by a class imported from another package; rename the receiver
        or suppress with a reason. A tensor whose device no project code decides (a
        metadata field or parameter declared ``torch.Tensor`` that only callers outside the project fill) is reported
        with low confidence; if it is in fact a host tensor, name it ``*_cpu`` or add its pattern to ``host-names``.
        The fields of a class are judged over every object of it: a batch that the per-step path plans with its host
        tensors and moves to the GPU afterwards, while a one-time graph capture moves a copy first
        (``dataclasses.replace(self, kv_indptr=self.kv_indptr.to(device))``) and plans with that, is reported on the
        per-step plan; suppress it with that reason.

    What it cannot see
        Arguments whose device is unknown and that nothing says are tensors (an unannotated value from outside the
        project, a C++ extension's result) are not reported; wrappers built by code outside the project and reached
        under another name, and plan functions reached through ``getattr`` with a computed name, are not recognised;
        positional arguments after a ``*args`` whose length is unknown are checked only by their names.
    """

    def check(self, ctx: Context) -> None:
        # Without a flashinfer import no callable is a plan function, and only ``x.plan(...)``-style calls remain.
        sites = (
            None
            if ctx.wrappers.enabled
            else {id(fn) for m in PLAN_METHODS for fn, _ in ctx.project.calls_by_name().get(m, [])}
        )
        for fn in ctx.project.all_functions():
            if sites is not None and id(fn) not in sites:
                continue
            for call in fn.calls:
                positions = self._plan_positions(ctx, call, fn)
                if positions is not None:
                    self._check_call(ctx, fn, call, positions)

    @staticmethod
    def _plan_positions(ctx: Context, call: ast.Call, fn: FunctionInfo) -> dict[int, str] | None:
        """Positional parameters of a FlashInfer plan call that must be host tensors; None if not a plan call.

        Arguments that a ``functools.partial`` already bound shift the positions of the ones the call passes."""
        func = call.func
        plan_fn = ctx.wrappers.plan_function(func, fn)
        if plan_fn is not None:  # fast_decode_plan(wrapper, indptr, indices, last_page_len, ...)
            bound = ctx.wrappers.bound_args(func, fn)
            return {i + 1 - bound: n for i, n in _DECODE.items() if i + 1 >= bound}
        alias = (
            None if isinstance(func, ast.Attribute) and func.attr in PLAN_METHODS else ctx.wrappers.bound_plan(func, fn)
        )
        if alias is not None:  # p = w.plan; p(...), or functools.partial(w.plan, ...)
            return {i - alias[1]: n for i, n in _family(alias[0]).items() if i >= alias[1]}
        if not isinstance(func, ast.Attribute) or func.attr not in PLAN_METHODS:
            return None
        cls = ctx.wrappers.wrapper_class(func.value, fn)
        d = dotted(func.value)
        if cls is None and not looks_like_wrapper(func.value) and not (d is not None and is_flashinfer_import(fn, d)):
            return None
        if cls is None and ctx.wrappers.built_elsewhere(func.value, fn):
            return None  # named like a wrapper, built by another package's class
        if cls is None:
            return {}
        return _family(cls)

    def _check_call(self, ctx: Context, fn: FunctionInfo, call: ast.Call, positions: dict[int, str]) -> None:
        keywords = [(kw.arg, kw.value, fn) for kw in call.keywords if kw.arg]
        keywords += [(k, v, fn) for kw in call.keywords if kw.arg is None for k, v in _splatted(kw.value, fn)]
        for kw in call.keywords if any(k.arg is None for k in call.keywords) else ():  # **(base | {...}), ChainMap,
            if kw.arg is None:  # a factory's dict, kw.setdefault(...): what the spread passes under each plan name
                seen = {id(v) for _, v, _ in keywords}
                for name in _HOST_SIDE_NAMES:
                    keywords += [
                        (name, v, w) for v, w in ctx.prov.flow.spread_values(kw.value, name, fn) if id(v) not in seen
                    ]
        for kw in call.keywords:  # **dataclasses.asdict(meta.plan_args()): the fields of each construction
            if kw.arg is None and (record := _record_of(kw.value, "asdict", fn)) is not None:
                keywords += [(k, *s) for fields in ctx.prov.flow.record_fields(record, fn) for k, s in fields if s]
        args: list[tuple[str, ast.expr, FunctionInfo]] = [(k, v, w) for k, v, w in keywords if _is_host_side_param(k)]
        for i, placed in enumerate(_placed(ctx, call.args, fn)):
            if placed is None:
                continue
            a, where = placed
            n = positions.get(i) or terminal_name(a)
            if n is not None and _is_host_side_param(n):
                args.append((n, a, where))
        bad: list[tuple[str, ast.expr]] = []
        unsure: list[tuple[str, ast.expr]] = []
        for param, expr, where in args:
            for e in _items(ctx, expr, where):
                w = ctx.prov.of(e, where)
                if w is Where.DEVICE:
                    bad.append((param, e))
                elif (
                    w is Where.UNKNOWN
                    and ctx.prov.tensorish(e, where)
                    and ctx.prov.tensor_where(e, where) is not Where.HOST
                ):
                    unsure.append((param, e))
        if bad:
            self._report(ctx, fn, call, bad, "device tensor(s)", Confidence.HIGH)
        elif unsure:
            self._report(ctx, fn, call, unsure, "tensor(s) of unknown device", Confidence.LOW)

    def _report(
        self,
        ctx: Context,
        fn: FunctionInfo,
        call: ast.Call,
        args: list[tuple[str, ast.expr]],
        kind: str,
        confidence: Confidence,
    ) -> None:
        what = ", ".join(f"`{snippet(e, 40)}` as {p}" for p, e in args)
        sync = "a blocking sync" if confidence is Confidence.HIGH else "a blocking sync if they are on the device"
        ctx.report(
            self,
            fn,
            call,
            f"{kind} {what} passed to `{snippet(call.func)}`; FlashInfer copies them to the host ({sync}) on every "
            "plan",
            hint="pass the host mirror (a pinned *_cpu buffer filled on the host) instead",
            evidence={"parameters": [p for p, _ in args]},
            confidence=confidence,
        )


def _record_of(expr: ast.expr, how: str, fn: FunctionInfo) -> ast.expr | None:
    """`x` of ``dataclasses.asdict(x)`` (`how` "asdict") or ``dataclasses.astuple(x)`` ("astuple"), also through a
    local bound once (``kw = dataclasses.asdict(meta.plan_args()); w.plan(**kw)``)."""
    changed = isinstance(expr, ast.Name) and (
        expr.id in fn.item_stores or any(_changes(c, expr.id) for c in fn.calls)  # kw["indptr"] = host; kw.update()
    )
    if isinstance(expr, ast.Name) and expr.id not in fn.params and len(fn.local_assigns.get(expr.id, [])) == 1:
        expr = fn.local_assigns[expr.id][0] if not changed else expr
    if isinstance(expr, ast.Call) and len(expr.args) == 1 and (dotted(expr.func) or "").split(".")[-1] == how:
        return expr.args[0]
    return _fields_by_name(expr) if how == "asdict" else None


def _fields_by_name(expr: ast.expr) -> ast.expr | None:
    """`x` of the other spellings of a dict of `x`'s fields: ``x._asdict()`` (a ``NamedTuple``) and ``{f.name:
    getattr(x, f.name) for f in dataclasses.fields(x)}``."""
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "_asdict":
        return expr.func.value if not expr.args else None
    if not (isinstance(expr, ast.DictComp) and len(expr.generators) == 1):
        return None
    gen = expr.generators[0]
    each = gen.target.id if isinstance(gen.target, ast.Name) else ""
    it, val = gen.iter, expr.value

    def named(e: ast.expr) -> bool:  # f.name
        return (
            isinstance(e, ast.Attribute) and e.attr == "name" and isinstance(e.value, ast.Name) and e.value.id == each
        )

    fields = isinstance(it, ast.Call) and (dotted(it.func) or "").split(".")[-1] == "fields"
    getter = isinstance(val, ast.Call) and dotted(val.func) == "getattr" and len(val.args) == 2
    if fields and getter and named(expr.key) and isinstance(val, ast.Call) and named(val.args[1]):
        return val.args[0]
    return None


def _changes(call: ast.Call, name: str) -> bool:
    f = call.func
    return (
        isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == name and f.attr in _DICT_WRITES
    )


_DICT_WRITES = frozenset({"update", "pop", "setdefault", "__setitem__", "clear"})


def _placed(ctx: Context, args: list[ast.expr], fn: FunctionInfo) -> list[tuple[ast.expr, FunctionInfo] | None]:
    """The positional arguments as `_positional` spreads them, with ``*dataclasses.astuple(x)`` spread as the fields
    of the one construction `x` is, each with the function that passes it (None for a field left to its default)."""
    out: list[tuple[ast.expr, FunctionInfo] | None] = []
    for a in args:
        record = _record_of(a.value, "astuple", fn) if isinstance(a, ast.Starred) else None
        if record is not None:
            made = ctx.prov.flow.record_fields(record, fn)
            if len(made) != 1:
                break  # the positions after an unknown spread are unknown
            out.extend(s for _, s in made[0])
            continue
        spread = _positional([a], fn)
        if not spread:
            break
        out.extend((e, fn) for e in spread)
    return out


def _positional(args: list[ast.expr], fn: FunctionInfo) -> list[ast.expr]:
    """The positional arguments with ``*args`` of a tuple or list literal spread in place (also through a local bound
    once: ``args = (indptr, indices); w.plan(*args, ...)``)."""
    out: list[ast.expr] = []
    for a in args:
        if not isinstance(a, ast.Starred):
            out.append(a)
            continue
        v = a.value
        if isinstance(v, ast.Name) and v.id not in fn.params:
            values = fn.local_assigns.get(v.id, [])
            v = values[0] if len(values) == 1 else v
        if not isinstance(v, ast.Tuple | ast.List) or any(isinstance(e, ast.Starred) for e in v.elts):
            break  # the positions after an unknown spread are unknown
        out.extend(v.elts)
    return out


def _splatted(expr: ast.expr, fn: FunctionInfo) -> list[tuple[str, ast.expr]]:
    """The keyword arguments a ``**kwargs`` passes: a dict literal or ``dict(k=v)``, also through a local bound once
    (``kw = dict(indptr=...); w.plan(**kw)``)."""
    if isinstance(expr, ast.Name) and expr.id not in fn.params:
        values = fn.local_assigns.get(expr.id, [])
        expr = values[0] if len(values) == 1 else expr
    if isinstance(expr, ast.Dict):
        return [
            (k.value, v)
            for k, v in zip(expr.keys, expr.values, strict=False)
            if isinstance(k, ast.Constant) and isinstance(k.value, str)
        ]
    if isinstance(expr, ast.Call) and dotted(expr.func) == "dict":
        return [(kw.arg, kw.value) for kw in expr.keywords if kw.arg]
    return []


def _family(cls: str) -> dict[int, str]:
    if "MLA" in cls:
        return _MLA
    if "Cascade" in cls:
        return _CASCADE
    return _PREFILL if "Prefill" in cls else _DECODE


def _items(ctx: Context, expr: ast.expr, fn: FunctionInfo) -> list[ast.expr]:
    """The tensors an argument holds, item by item: a cascade plan takes one tensor per level, in a list literal,
    a repeated list (``[t] * 2``) or a local list built elsewhere (``levels = [a, b]``, ``levels.append(c)``)."""
    if isinstance(expr, ast.List | ast.Tuple):
        return [e for e in expr.elts if not isinstance(e, ast.Starred)]
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mult):
        side = expr.left if isinstance(expr.left, ast.List | ast.Tuple) else expr.right
        if isinstance(side, ast.List | ast.Tuple):
            return _items(ctx, side, fn)
    if isinstance(expr, ast.Name) and expr.id not in fn.params:
        values = fn.local_assigns.get(expr.id, [])
        if values and all(isinstance(v, ast.List | ast.Tuple | ast.ListComp) for v in values):
            return [e for e, where in ctx.prov.flow.element_sources(expr, fn) if where is fn]
    return [expr]


# Positional parameters of plan() that FlashInfer copies to the host, per wrapper family.
_DECODE = {0: "indptr", 2: "last_page_len"}
_PREFILL = {0: "qo_indptr", 1: "paged_kv_indptr", 3: "paged_kv_last_page_len"}
_MLA = {0: "qo_indptr", 1: "kv_indptr", 3: "kv_len_arr"}
_CASCADE = {0: "qo_indptr_arr", 1: "paged_kv_indptr_arr", 3: "paged_kv_last_page_len"}
