"""FC102 device-tensor-to-plan: a device tensor passed as indptr / last_page_len / seq_lens to a FlashInfer plan."""

from __future__ import annotations

import ast

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
    )


@rule("FC102", "device-tensor-to-plan")
class DeviceTensorToPlan(Rule):
    """A device tensor is passed as indptr, last_page_len or seq_lens to a FlashInfer ``plan()``.

    What it checks
        Calls of ``plan``, ``begin_forward``, ``fast_decode_plan`` (and ``fast_mla_decode_plan``) on a FlashInfer
        wrapper (a receiver named ``*wrapper*`` or a function imported from ``flashinfer``) whose indptr,
        ``last_page_len``, ``seq_lens`` or ``kv_lens`` argument (by keyword, or a positional argument whose name
        says so) is known to live on the device: built with ``device="cuda"``/``device=self.device``, ``.cuda()``,
        ``.to(device)``, a slice of such a buffer, or named ``*_gpu``/``*_cuda``/``*_device``.

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
        A ``plan`` method of an engine class that is not FlashInfer's, called on a receiver named ``*wrapper*``,
        is reported; rename the receiver or suppress with a reason. Arguments whose provenance is unknown are not
        reported (false negatives rather than noise).
    """

    def check(self, ctx: Context) -> None:
        for fn in ctx.project.all_functions():
            for call in fn.calls:
                if self._is_plan_call(call, fn):
                    self._check_call(ctx, fn, call)

    @staticmethod
    def _is_plan_call(call: ast.Call, fn: FunctionInfo) -> bool:
        func = call.func
        if isinstance(func, ast.Name):
            return func.id in PLAN_METHODS and func.id.startswith("fast_")
        if not isinstance(func, ast.Attribute) or func.attr not in PLAN_METHODS:
            return False
        if func.attr.startswith("fast_"):
            return True
        d = dotted(func.value)
        return looks_like_wrapper(func.value) or (d is not None and is_flashinfer_import(fn, d))

    def _check_call(self, ctx: Context, fn: FunctionInfo, call: ast.Call) -> None:
        args: list[tuple[str, ast.expr]] = [
            (kw.arg, kw.value) for kw in call.keywords if kw.arg and _is_host_side_param(kw.arg)
        ]
        for a in call.args:
            n = terminal_name(a)
            if n is not None and _is_host_side_param(n):
                args.append((n, a))
        for param, expr in args:
            if ctx.prov.of(expr, fn) is Where.DEVICE:
                ctx.report(
                    self,
                    fn,
                    expr,
                    f"`{snippet(expr)}` is a device tensor passed as {param} to `{snippet(call.func)}`; FlashInfer "
                    "copies it to the host (a blocking sync) on every plan",
                    hint="pass the host mirror (a pinned *_cpu buffer filled on the host) instead",
                    evidence={"parameter": param},
                )
