"""FC103 flashinfer-private-attribute: engine code reads or writes a FlashInfer wrapper's private attribute."""

from __future__ import annotations

import ast

from flashcheck.verifier.astutil import dotted
from flashcheck.verifier.engine import Context, Rule, rule
from flashcheck.verifier.flashinfer_api import (
    GENERIC_PRIVATE,
    SPECIFIC_PRIVATE,
    is_flashinfer_import,
    looks_like_wrapper,
)
from flashcheck.verifier.project import ClassInfo, FunctionInfo

_REFLECTION = frozenset({"getattr", "setattr", "hasattr", "delattr"})


@rule("FC103", "flashinfer-private-attribute")
class FlashinferPrivateAttribute(Rule):
    """Engine code depends on a private attribute of a FlashInfer wrapper.

    What it checks
        Reads and writes of FlashInfer's private state from outside FlashInfer: ``_plan_info``,
        ``_cached_module``, ``_int_workspace_buffer``, ``_float_workspace_buffer``, ``_paged_kv_indptr_buf``,
        ``_use_cuda_graph``, ``_fixed_batch_size``, ``_max_total_num_rows`` and the other buffer fields, also through
        ``getattr``/``setattr``/``hasattr`` with a literal name. Common names (``_backend``, ``_kv_layout``,
        ``_sm_scale``...) are reported only on a receiver named ``*wrapper*``. ``self._x`` is reported only in a
        class that derives from a class imported from ``flashinfer``.

    Why it breaks serving
        These fields change meaning, type or existence between FlashInfer releases: ``_plan_info`` is a tensor in
        one release and ``List[int]`` in another (rtp-llm PR 1099 crashed on ``_plan_info.detach()``), and writing
        ``_use_cuda_graph`` or a ``_*_buf`` after construction desynchronises the wrapper from the buffers a
        captured graph already reads. An upgrade then fails at run time, far from the cause.

    Example
        ::

            plan_info = self.prefill_wrapper._plan_info            # FC103
            setattr(wrapper, "_use_cuda_graph", True)              # FC103

    Use instead
        Use the public API (``plan()`` arguments, constructor buffers), keep your own copy of what you passed to
        ``plan()``, or isolate the access in one compatibility module that checks the FlashInfer version at start-up
        (and suppress it there with a reason).

    Known false positives
        An engine class that happens to define an attribute with one of the FlashInfer-specific names
        (``self._plan_info`` in a class not derived from FlashInfer) is not reported; the same name on another
        object (``other._plan_info``) is.
    """

    def check(self, ctx: Context) -> None:
        for fn in ctx.project.all_functions():
            for attr in fn.attributes:
                if attr.attr.startswith("_") and not attr.attr.startswith("__"):
                    self._check(ctx, fn, attr, attr.value, attr.attr)
            for call in fn.calls:
                if isinstance(call.func, ast.Name) and call.func.id in _REFLECTION and len(call.args) >= 2:
                    lit = call.args[1]
                    if isinstance(lit, ast.Constant) and isinstance(lit.value, str):
                        self._check(ctx, fn, call, call.args[0], lit.value)

    def _check(self, ctx: Context, fn: FunctionInfo, node: ast.AST, receiver: ast.expr, attr: str) -> None:
        if attr in SPECIFIC_PRIVATE:
            if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls") and not _derives_flashinfer(fn):
                return
        elif attr in GENERIC_PRIVATE:
            if not looks_like_wrapper(receiver):
                return
        else:
            return
        ctx.report(
            self,
            fn,
            node,
            f"`{attr}` is private FlashInfer state (read through `{ast.unparse(receiver)[:60]}`); its type and "
            "meaning change between FlashInfer releases",
            hint="use the public wrapper API or keep your own copy of the values you passed to plan(); isolate "
            "unavoidable accesses in one version-checked module",
            evidence={"attribute": attr},
        )


def _derives_flashinfer(fn: FunctionInfo) -> bool:
    """Whether the method's class derives (through project classes) from a class imported from flashinfer."""
    owner = fn
    while owner.parent is not None:
        owner = owner.parent
    return owner.cls is not None and _class_derives(owner.cls, 0)


def _class_derives(cls: ClassInfo, depth: int) -> bool:
    body = cls.module.body
    for b in cls.node.bases:
        d = dotted(b)
        if d is not None and body is not None and is_flashinfer_import(body, d):
            return True
    return depth < 8 and any(_class_derives(c, depth + 1) for c in cls.bases)
