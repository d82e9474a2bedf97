"""FC103 flashinfer-private-attribute: engine code reads or writes a FlashInfer wrapper's private attribute."""

from __future__ import annotations

import ast

from flashcheck.verifier.astutil import dotted
from flashcheck.verifier.engine import Context, Rule, rule
from flashcheck.verifier.flashinfer_api import (
    GENERIC_PRIVATE,
    SPECIFIC_PRIVATE,
    WRAPPER_PRIVATE,
    looks_like_wrapper,
)
from flashcheck.verifier.index import with_bases
from flashcheck.verifier.operator_idioms import as_written
from flashcheck.verifier.project import FunctionInfo

_REFLECTION = frozenset({"getattr", "setattr", "hasattr", "delattr"})


# Every other private name a FlashInfer wrapper sets: reported only on a receiver the value flow shows is a wrapper
# (not by its name alone), and not where the engine's own class sets it (then it is the engine's state).
_OTHER = WRAPPER_PRIVATE - SPECIFIC_PRIVATE - GENERIC_PRIVATE
_KNOWN = frozenset(n for n in SPECIFIC_PRIVATE | GENERIC_PRIVATE | _OTHER if n.startswith("_"))


@rule("FC103", "flashinfer-private-attribute")
class FlashinferPrivateAttribute(Rule):
    """Engine code depends on a private attribute of a FlashInfer wrapper.

    What it checks
        Reads and writes of FlashInfer's private state from outside FlashInfer: ``_plan_info``, ``_cached_module``,
        ``_int_workspace_buffer``, ``_float_workspace_buffer``, ``_paged_kv_indptr_buf``, ``_use_cuda_graph``,
        ``_fixed_batch_size``, ``_max_total_num_rows`` and the other buffer fields, also through
        ``getattr``/``setattr``/``hasattr`` with a name the value flow resolves to string constants (a literal, a local,
        module or class constant (also one imported from another project module), a loop variable over a tuple of them,
        also a module-level tuple), through ``vars(w)[...]``/``w.__dict__[...]`` and their ``.get(...)``, and through
        ``operator.attrgetter("_x")`` called on a wrapper or mapped over a list of them (``map(attrgetter(...), ws)``).
        Common names (``_backend``, ``_kv_layout``, ``_sm_scale``...) are reported only on a receiver that is a wrapper
        (by dataflow from its constructor, also as an item of lists and dicts of wrappers, of their
        ``zip``/``enumerate``/``.items()`` loops and of ``itertools.chain``/``chain.from_iterable`` over them, or named
        ``*wrapper*``), also a parameter of a shim of any name that receives a wrapper: bound by
        ``functools.partial(shim, w)`` or ``types.MethodType(shim, w)`` (at any position or by keyword), the first
        parameter of a function assigned onto a wrapper class (``BatchDecodeWithPagedKVCacheWrapper.plan = shim``), or
        passed a wrapper by callers. ``self._x`` (common names too) is reported in a class that derives from a
        FlashInfer wrapper (directly, through project classes or a module-level alias) and in free functions whose first
        parameter is ``self`` (plan shims monkey-patched onto the wrapper). Every other private attribute FlashInfer's
        wrapper classes set (``_batch_prefill_wrappers``, ``_num_levels``...) is reported on a receiver the value flow
        shows is a FlashInfer wrapper (not by its name), unless the engine's own classes set it (the receiver's project
        class, its bases, mixins and subclasses): then it is the engine's state.

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

    What it cannot see
        Names built at run time (``getattr(w, "_" + name)``), wrappers that flow in from outside the project, and
        shims installed with ``setattr`` or bound outside the project (their parameter holds a wrapper the analysis
        never sees passed).
    """

    def check(self, ctx: Context) -> None:
        named = _KNOWN & ctx.project.private_strings()  # no other name argument can be one of ours
        anywhere = bool(named & SPECIFIC_PRIVATE)  # names reported on any receiver, the others on wrappers only
        for fn in ctx.project.all_functions():
            for attr in fn.attributes:
                if attr.attr in _KNOWN and not attr.attr.startswith("__"):  # `_check` knows no other name
                    self._check(ctx, fn, attr, attr.value, attr.attr)
            for call in fn.calls:
                if isinstance(call.func, ast.Name) and call.func.id in _REFLECTION and len(call.args) >= 2:
                    if not named or not (anywhere or _wrapperish(ctx, fn, call.args[0])):
                        continue  # resolving the name argument is the dear part: only where it may matter
                    for name in ctx.prov.flow.attribute_names(call.args[1], fn, call.lineno):
                        self._check(ctx, fn, call, call.args[0], name)
            for sub in fn.subscripts:  # vars(w)["_plan_info"], w.__dict__["_plan_info"]
                key = sub.slice
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    owner = _dict_owner(sub.value)
                    if owner is not None:
                        self._check(ctx, fn, sub, owner, key.value)
            for call in fn.calls:  # vars(w).get("_use_tensor_cores"), w.__dict__.setdefault(...)
                f = call.func
                if isinstance(f, ast.Name) and f.id == "map" and len(call.args) == 2:  # map(attrgetter("_x"), ws)
                    item = ast.copy_location(ast.Subscript(call.args[1], ast.Constant(...), ast.Load()), call)
                    for name in _getter_names(call.args[0], fn) if ctx.wrappers.wrapper_class(item, fn) else ():
                        self._check(ctx, fn, call, item, name)
                if named and isinstance(f, ast.Attribute) and f.attr in _DICT_ACCESS and call.args:
                    owner = _dict_owner(f.value)
                    if owner is not None and (anywhere or _wrapperish(ctx, fn, owner)):
                        for name in ctx.prov.flow.attribute_names(call.args[0], fn, call.lineno):
                            self._check(ctx, fn, call, owner, name)

    def _check(self, ctx: Context, fn: FunctionInfo, node: ast.AST, receiver: ast.expr, attr: str) -> None:
        if attr in SPECIFIC_PRIVATE:
            if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls") and not _is_wrapper_self(ctx, fn):
                return
        elif attr in GENERIC_PRIVATE:
            if not _wrapperish(ctx, fn, receiver):
                return
        elif attr in _OTHER:
            if ctx.wrappers.wrapper_class(receiver, fn) is None or _engine_state(ctx, fn, receiver, attr):
                return
        else:
            return
        ctx.report(
            self,
            fn,
            node,
            f"`{attr}` is private FlashInfer state (read through `{as_written(receiver)[:60]}`); its type and "
            "meaning change between FlashInfer releases",
            hint="use the public wrapper API or keep your own copy of the values you passed to plan(); isolate "
            "unavoidable accesses in one version-checked module",
            evidence={"attribute": attr},
        )


_DICT_ACCESS = frozenset({"get", "setdefault", "pop", "__getitem__", "__setitem__"})


def _getter_names(func: ast.expr, fn: FunctionInfo) -> list[str]:
    """The attribute names a call of `func` reads from its argument when `func` is ``operator.attrgetter("a",
    ...)``, directly or kept in a module-level name (``_PLANNED_WINDOW = operator.attrgetter("_window_left")``)."""
    if isinstance(func, ast.Name) and fn.module.body is not None and func.id not in fn.local_assigns:
        values = fn.module.body.local_assigns.get(func.id, [])
        func = values[0] if len(values) == 1 else func
    if not isinstance(func, ast.Call) or (dotted(func.func) or "").rsplit(".", 1)[-1] != "attrgetter":
        return []
    return [a.value.split(".")[0] for a in func.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]


def _wrapperish(ctx: Context, fn: FunctionInfo, receiver: ast.expr) -> bool:
    """Whether `receiver` may be a FlashInfer wrapper: ``self`` of a wrapper subclass, a wrapper-like name, or an
    object the value flow traces to a wrapper's constructor."""
    own = isinstance(receiver, ast.Name) and receiver.id in ("self", "cls") and _is_wrapper_self(ctx, fn)
    return own or looks_like_wrapper(receiver) or ctx.wrappers.wrapper_class(receiver, fn) is not None


def _dict_owner(expr: ast.expr) -> ast.expr | None:
    """`w` for ``vars(w)`` and ``w.__dict__``."""
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "vars" and expr.args:
        return expr.args[0]
    if isinstance(expr, ast.Attribute) and expr.attr == "__dict__":
        return expr.value
    return None


def _engine_state(ctx: Context, fn: FunctionInfo, receiver: ast.expr, attr: str) -> bool:
    """`attr` is state the engine's own classes set on the receiver: its project class (a wrapper subclass), one of
    that class's project bases or mixins, or a subclass of it, stores ``self.<attr>`` (also by unpacking or
    ``setattr``)."""
    cls = ctx.prov.flow.instance_type(receiver, fn)
    if cls is None:
        return False
    related = [*with_bases(cls), *(b for sub in ctx.project.subclasses_of(cls) for b in with_bases(sub))]
    for c in related:
        if attr in c.attr_assigns or attr in c.attr_unpacks or attr in c.attr_types:
            return True
    names = {n for c in related for m in c.methods.values() for n in _setattr_names(ctx, m)}
    return attr in names


def _setattr_names(ctx: Context, fn: FunctionInfo) -> list[str]:
    """The attribute names ``setattr(self, name, ...)`` calls in `fn` may set."""
    return [
        n
        for call in fn.calls
        if isinstance(call.func, ast.Name)
        and call.func.id == "setattr"
        and len(call.args) >= 2
        and isinstance(call.args[0], ast.Name)
        and call.args[0].id == "self"
        for n in ctx.prov.flow.attribute_names(call.args[1], fn, call.lineno)
    ]


def _is_wrapper_self(ctx: Context, fn: FunctionInfo) -> bool:
    """``self`` is a FlashInfer wrapper: in a (direct or indirect) subclass of one, or in a free function whose
    first parameter is ``self`` (a plan shim assigned onto the wrapper class or instance)."""
    owner = fn
    while owner.parent is not None:
        owner = owner.parent
    if owner.cls is None:
        return not isinstance(owner.node, ast.Module) and next(iter(owner.params), None) == "self"
    return ctx.wrappers.flashinfer_base(owner.cls) is not None
