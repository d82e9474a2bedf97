"""FC106 constant-workspace-size: a FlashInfer workspace whose size is a bare constant."""

from __future__ import annotations

import ast

from flashcheck.findings import Confidence, Severity
from flashcheck.verifier.astutil import dotted, kwarg, name_tokens, name_words, terminal_name
from flashcheck.verifier.dataflow import ALLOCATORS, allocations
from flashcheck.verifier.engine import Context, Rule, rule
from flashcheck.verifier.flashinfer_api import (
    flashinfer_call_sites,
    imported_elsewhere,
    imports_flashinfer,
    workspace_arg,
)
from flashcheck.verifier.index import ClassInfo, with_bases
from flashcheck.verifier.operator_idioms import as_written
from flashcheck.verifier.project import FunctionInfo, ModuleInfo, Project, torch_name
from flashcheck.verifier.provenance.calls import NAMESPACES
from flashcheck.verifier.rules.fc101_host_sync import snippet


@rule("FC106", "constant-workspace-size", severity=Severity.WARNING, confidence=Confidence.MEDIUM)
class ConstantWorkspaceSize(Rule):
    """A FlashInfer workspace is sized by a bare constant instead of the engine's limits.

    What it checks
        Allocations (``torch.empty``/``zeros``/..., also through ``from torch import empty as E``) assigned to a name
        with the word ``workspace`` or passed as the workspace of a FlashInfer wrapper or function, whose size is a
        literal, arithmetic on literals (also a choice between two, ``(384 if NEW_API else 128) << 20``: fixed either
    way), or a module constant bound to one (``WORKSPACE = 128 * 1024 * 1024``, also
        imported, also from a package that re-exports it or through a star import, or read as ``cfg_module.WORKSPACE``;
        not one that other code rebinds, through the module or after ``global``), a class attribute bound once and read
        through the instance (``self.WORKSPACE_BYTES``) or through the class, enum members included (``WsSize.DECODE``),
        an attribute of a module-level config object that is set once to a constant
        (``global_config.flashinfer_workspace_size``; a field of a module-level ``SimpleNamespace(workspace_bytes=...)``
        that no code stores), an entry of a module-level dict or tuple literal that no code stores into, updates or
        rebinds (also through an import, a re-export or the module) (``_WS_BYTES["full"]``,
        ``_TIERS[0]``; under a key only known at run time, ``_WS_MIB[kernel.value]``, when every entry is a constant),
        or an environment variable with a constant default, a number or a string of digits read with ``int()``
        (``int(os.environ.get("WS_BYTES", 128 << 20))``, ``int(os.getenv("WS_MB", "128")) << 20``, ``int(os.getenv("WS")
        or 64 << 20)``), or the result of a call that returns a constant (a helper without parameters, a module-level
        lambda, also imported from another module, a table of lambdas picked at run time: ``_WS_BYTES[kind]()``, a
        method of an enum member that returns a constant of its value: ``WorkspaceTier.LARGE.nbytes()``), also built in
        a list comprehension or a dataclass field's ``default_factory``. Allocations behind project factories and caches
        are traced; so are functions with ``workspace`` in their name that return an allocation. Sizes computed from
        configuration or engine limits (``max_num_tokens``, ``chunked_prefill_size``) are not reported, nor are fields
        of a class whose constructor is built from its fields (``@dataclass``, attrs, ``NamedTuple``, pydantic) even
        with a constant default (``cfg.workspace_bytes``: each instance may be built with another value; a ``ClassVar``
        is still reported), nor is code in tests and benchmarks (``tests/``, ``test_*.py``, ``benchmarks/``,
        ``bench_*.py``), nor a local named like a workspace that only callables from outside the project and outside
        FlashInfer are handed and that the function keeps nowhere (``flash_mla_cuda.dense_prefill_fwd(workspace_buffer,
        ...)``: another kernel's scratch).

    Why it breaks serving
        The bytes FlashInfer's planner needs grow with the batch: split-k partial outputs scale with tokens, heads
        and chunks. A constant that fits the benchmark overflows on the first long prefill or large DP batch:
        ``plan()`` fails at run time, or worse, a graph captured with the small buffer is replayed with a plan that
        needs more (rtp-llm PR 1099 sized the prefill workspace from ``plan_info``; SGLang PR 26643 had to size its
        dispatcher workspace from ``max(chunked_prefill_size, max_running_req)``).

    Example
        ::

            WORKSPACE_BYTES = 128 * 1024 * 1024
            self.workspace_buffer = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)   # FC106

    Use instead
        Derive the size from the engine's limits (max tokens per step, max batch, heads, chunk size), make it a
        configuration value, or check the planner's requirement at start-up and fail early with the numbers.

    Known false positives
        A constant that was derived by hand from the engine's fixed limits (a decode-only engine with a fixed batch)
        is reported; suppress it with a reason that states the bound. The workspace of a FlashInfer kernel without a
        planner whose scratch is bounded by the SM count rather than the batch (XQA, trtllm-gen, ``trtllm_fmha_v2``
        with multi-CTA off) is reported like a planner's, and so is another kernel's scratch that a function named
        ``*workspace*`` returns from a cache; suppress with the bound as the reason.

    What it cannot see
        Constants defined outside the project (an installed package's default), sizes read from a config file at
        run time (not constant, so not reported), a configuration dataclass that every caller builds with its default
        (the field is treated as configuration), and workspaces allocated by C++ extensions.
    """

    def check(self, ctx: Context) -> None:
        seen: set[int] = set()
        project = ctx.project
        flashinfer_sites = flashinfer_call_sites(project, ctx.wrappers.subclass_names())
        for fn in project.all_functions():
            candidates: list[tuple[ast.Call, FunctionInfo]] = []
            for a in fn.assigns:
                if isinstance(a, ast.Assign | ast.AnnAssign) and isinstance(a.value, ast.Call | ast.ListComp):
                    targets = a.targets if isinstance(a, ast.Assign) else [a.target]
                    named = [t for t in targets if _names_workspace(terminal_name(t) or "")]
                    if named and not all(isinstance(t, ast.Name) and _kernel_scratch(ctx, t.id, fn) for t in named):
                        candidates.extend(allocations(a.value, fn, project=project))
            if "workspace" in fn.name.lower() and "workspace" in name_tokens(fn.name):  # get_workspace()
                for r in fn.returns:
                    candidates.extend(allocations(r, fn, project=project))
            for call in fn.calls if id(fn) in flashinfer_sites else ():
                if ctx.wrappers.constructed(call, fn) or imports_flashinfer(fn, call.func):
                    ws = workspace_arg(call, fn)
                    if ws is not None:
                        candidates.extend(allocations(ws, fn, project=project))
            for alloc, where in candidates:
                if id(alloc) in seen:
                    continue
                seen.add(id(alloc))
                size = _size_arg(alloc, where)
                placeholder = isinstance(size, ast.Constant) and size.value == 0  # resized before first use
                if size is not None and not placeholder and _is_constant(size, where, project, 0):
                    ctx.report(
                        self,
                        where,
                        alloc,
                        f"workspace `{snippet(alloc)}` has a fixed size (`{snippet(size, 40)}`); the planner's "
                        "need grows with batch size, tokens and heads",
                        hint="size it from the engine's limits or configuration, and check plan()'s requirement "
                        "at start-up",
                        evidence={"size": as_written(size)},
                    )


def _kernel_scratch(ctx: Context, name: str, fn: FunctionInfo) -> bool:
    """A local named like a workspace that only callables imported from outside FlashInfer and the project are
    handed (``flash_mla_cuda.dense_prefill_fwd(workspace_buffer, ...)``, an extension's top-k kernel), and that
    the function keeps nowhere (no other value, return or container holds it): another kernel's scratch, not the
    workspace of a FlashInfer planner."""
    uses = [c for c in fn.calls if any(_is_name(a, name) for a in (*c.args, *(k.value for k in c.keywords)))]
    if not uses or not all(imported_elsewhere(c.func, fn, ctx.project) for c in uses):
        return False
    handed = {id(a) for c in uses for a in (*c.args, *(k.value for k in c.keywords))}
    held = [*fn.returns, *(a.value for a in fn.assigns if a.value is not None)]
    return not any(isinstance(n, ast.Name) and n.id == name and id(n) not in handed for h in held for n in ast.walk(h))


def _is_name(node: ast.expr, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _size_arg(alloc: ast.Call, fn: FunctionInfo) -> ast.expr | None:
    name = (torch_name(alloc.func, fn) or "").rsplit(".", 1)[-1]
    if name not in ALLOCATORS or name.endswith("_like") or name in ("tensor", "as_tensor", "arange"):
        return None
    size = kwarg(alloc, "size") or (alloc.args[0] if alloc.args else None)
    if isinstance(size, ast.Tuple | ast.List) and len(size.elts) == 1:
        size = size.elts[0]
    return size


def _names_workspace(name: str) -> bool:
    """Whether a name calls its value a workspace (``float_workspace_buffer``, ``self._ws``), not something of one
    (``workspace_starts``, ``ws_offsets``): its last word is a workspace word, or a buffer word after one
    (``workspace_int_buffer``)."""
    low = name.lower()  # a substring test first: tokenising every assignment target of a project is slow
    if not ("workspace" in low or "ws" in low) or not _WORKSPACE_WORDS & name_tokens(name):
        return False
    words = name_words(name)
    return bool(words) and (words[-1] in _WORKSPACE_WORDS or words[-1] in _BUFFER_WORDS)


def _is_constant(expr: ast.expr, fn: FunctionInfo, project: Project, depth: int, text: bool = False) -> bool:
    """Whether `expr` is a fixed number; with `text` (inside ``int(...)``) a string of digits counts too
    (``int(os.getenv("WS_MB", "128"))``)."""
    if depth > 5:
        return False
    if isinstance(expr, ast.Constant):
        if text and isinstance(expr.value, str):
            return expr.value.strip().lstrip("+-").isdigit()
        return isinstance(expr.value, int) and not isinstance(expr.value, bool)
    # the operands of an expression are no hop to another definition: they share the depth (192 * 1024 * 1024)
    if isinstance(expr, ast.BinOp):
        return _is_constant(expr.left, fn, project, depth) and _is_constant(expr.right, fn, project, depth)
    if isinstance(expr, ast.IfExp):  # (384 if NEW_API else 128) << 20: fixed either way
        return _is_constant(expr.body, fn, project, depth, text) and _is_constant(expr.orelse, fn, project, depth, text)
    if isinstance(expr, ast.BoolOp) and isinstance(expr.op, ast.Or):  # os.getenv("WS") or 128 << 20
        *env, fallback = expr.values
        return all(_is_env(e) for e in env) and _is_constant(fallback, fn, project, depth + 1, text)
    if isinstance(expr, ast.Tuple | ast.List):
        return bool(expr.elts) and all(_is_constant(e, fn, project, depth + 1) for e in expr.elts)
    if isinstance(expr, ast.Call):
        name = dotted(expr.func) or ""
        if name == "int" and len(expr.args) == 1:
            return _is_constant(expr.args[0], fn, project, depth + 1, text=True)
        if name in _ENV_GETTERS and len(expr.args) == 2:  # an environment variable with a constant default
            return _is_constant(expr.args[1], fn, project, depth + 1, text)
        return _returns_constant(expr.func, fn, project, depth + 1)
    if isinstance(expr, ast.Attribute):
        return _attribute_constant(expr, fn, project, depth)
    if (
        isinstance(expr, ast.Subscript)
        and isinstance(expr.value, ast.Name | ast.Attribute)
        and not isinstance(expr.slice, ast.Slice)
    ):
        # _WS_BYTES["full"] of a module-level table; _WS_MIB[kernel.value]: whichever entry, each one a constant
        key = expr.slice.value if isinstance(expr.slice, ast.Constant) else _ANY_KEY
        items = _table_items(expr.value, key, fn, project)
        return bool(items) and all(_is_constant(v, where, project, depth + 1, text) for v, where in items)
    if isinstance(expr, ast.Name):
        scope = fn if expr.id in fn.local_assigns else fn.module.body
        if scope is None or expr.id in fn.params or (scope is not fn and _bound_otherwise(expr.id, fn)):
            return False  # a parameter, a loop variable or a name unpacked from a call: not a constant
        outer = fn.parent if scope is not fn else None
        while outer is not None and outer is not fn.module.body:  # a closure reads its enclosing function's local
            if expr.id in outer.params:
                return False
            if expr.id in outer.local_assigns:
                scope = outer
                break
            outer = outer.parent
        grown = [a.value for a in scope.assigns if isinstance(a, ast.AugAssign) and _is_name(a.target, expr.id)]
        if not all(_is_constant(g, scope, project, depth + 1) for g in grown):
            return False  # workspace_bytes += 4 * bs * ...: added up from the batch (``*= 2`` keeps a constant)
        values = scope.local_assigns.get(expr.id)
        if values and scope is fn.module.body and fn.module.global_stores.get(expr.id):
            return False  # _WS = 128 << 20, and configure() sets it after ``global _WS``: configuration
        if values:
            return len(values) == 1 and _is_constant(values[0], scope, project, depth + 1, text)
        bound = _module_value(fn.module, expr.id, project)  # imported, also re-exported
        if bound is not None and bound[1] is not fn.module.body:
            return _is_constant(bound[0], bound[1], project, depth + 1, text)
    return False


def _module_value(module: ModuleInfo, name: str, project: Project) -> tuple[ast.expr, FunctionInfo] | None:
    """The one value the module that binds the global `name` (as `module` reads it: its own, imported, re-exported)
    gives it at its top level, with that module's body; None when it is bound more than once, set after ``global``
    by a function, or changed or rebound by other code (configuration, not a fixed size)."""
    found = project.binding(module, name)
    body = found[0].body if found is not None else None
    if found is None or body is None:
        return None
    owner, bound = found
    values = body.local_assigns.get(bound, [])
    if len(values) != 1 or owner.global_stores.get(bound) or _changed(bound, owner.name, project):
        return None
    return values[0], body


_ANY_KEY = object()  # a key the analysis does not know: any entry of the table


def _returns_constant(func: ast.expr, fn: FunctionInfo, project: Project, depth: int) -> bool:
    """Whether calling `func` gives a fixed number: a lambda or project function whose every return is one
    (``def default_ws(): return 128 << 20``), also kept in a module name or as the entries of a module-level table
    (``_WS_BYTES[kind]()`` with ``{"decode": lambda: 128 << 20, ...}``)."""
    if depth > 5:
        return False
    if isinstance(func, ast.Lambda):
        return _is_constant(func.body, fn, project, depth + 1)
    if isinstance(func, ast.Subscript) and isinstance(func.value, ast.Name) and not isinstance(func.slice, ast.Slice):
        key = func.slice.value if isinstance(func.slice, ast.Constant) else _ANY_KEY
        items = _table_items(func.value, key, fn, project)
        return bool(items) and all(_returns_constant(v, where, project, depth + 1) for v, where in items)
    lam: tuple[ast.expr, FunctionInfo] | None = None  # a module-level lambda: its own module's, imported, re-exported
    if isinstance(func, ast.Name) and func.id not in fn.params and func.id not in fn.local_assigns:
        lam = _module_value(fn.module, func.id, project)
    elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):  # config.ws_bytes() of a module
        held = project.resolve_def(func.value, fn)
        lam = _module_value(held, func.attr, project) if isinstance(held, ModuleInfo) else None
    if lam is not None and isinstance(lam[0], ast.Lambda):
        return _is_constant(lam[0].body, lam[1], project, depth + 1)
    target = project.resolve_def(func, fn) if isinstance(func, ast.Name | ast.Attribute) else None
    if target is None and isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute):
        owner = project.resolve_def(func.value.value, fn)  # WorkspaceTier.LARGE.nbytes(): the enum's method
        if isinstance(owner, ClassInfo) and _is_enum(owner) and func.value.attr in owner.attr_assigns:
            target = project.method(owner, func.attr)
    if (
        not isinstance(target, FunctionInfo)
        or not target.returns
        or any(p not in ("self", "cls") for p in target.params)
    ):
        return False  # a function of its arguments is sized by what callers pass
    return all(_is_constant(r, target, project, depth + 1) for r in target.returns)


def _table_items(
    name: ast.Name | ast.Attribute, key: object, fn: FunctionInfo, project: Project
) -> list[tuple[ast.expr, FunctionInfo]]:
    """The entry under `key` (every entry for `_ANY_KEY`) of a module-level dict or tuple literal bound once that no
    code of the project changes (an item stored, ``update``/``setdefault``/``pop``/``clear``, here or where it is
    imported), read by name or through its module (``limits.WS_BY_KIND``); empty when there is no such table or
    entry."""
    if isinstance(name, ast.Attribute):
        held = project.resolve_def(name.value, fn)
        bound = _module_value(held, name.attr, project) if isinstance(held, ModuleInfo) else None
    elif name.id in fn.params or name.id in fn.local_assigns:
        return []
    else:  # the module's own table, or one imported from another (from .config import _WS_MIB)
        bound = _module_value(fn.module, name.id, project)
    if bound is None:
        return []
    table, body = bound
    if isinstance(table, ast.Dict):
        if None in table.keys:  # {**other, ...}
            return []
        pairs = zip(table.keys, table.values, strict=False)
        found = [v for k, v in pairs if key is _ANY_KEY or (isinstance(k, ast.Constant) and k.value == key)]
        return [(v, body) for v in found] if key is _ANY_KEY or len(found) == 1 else []
    if isinstance(table, ast.Tuple):
        if key is _ANY_KEY:
            return [(e, body) for e in table.elts if not isinstance(e, ast.Starred)]
        if isinstance(key, int) and -len(table.elts) <= key < len(table.elts):
            return [(table.elts[key], body)]
    return []


_MUTATORS = frozenset({"update", "setdefault", "pop", "popitem", "clear", "__setitem__"})


def _changed(table: str, module: str, project: Project) -> bool:
    """Whether code of `module`, or of a module that imports `table` from it (also through re-exports and under
    another name), stores into or updates `table`, or does so through the module (``limits.TABLE[k] = n``)."""
    where = (module, table)
    names: dict[str, str | None] = {}  # module -> the name `table` has there
    for f in project.all_functions():
        m = f.module
        if m.name not in names:
            names[m.name] = table if m.name == module else _local_name(m, where, project)
        local = names[m.name]
        if local is not None and local in f.item_stores:
            return True
        for c in f.calls:
            g = c.func
            if isinstance(g, ast.Attribute) and g.attr in _MUTATORS and _is_table(g.value, local, where, f, project):
                return True
        for s in f.subscripts:
            stored = isinstance(s.ctx, ast.Store | ast.Del) and isinstance(s.value, ast.Attribute)
            if stored and _is_table(s.value, None, where, f, project):
                return True
        for a in f.attributes:  # tables.WS_TABLE = {...} from another module
            if isinstance(a.ctx, ast.Store) and _is_table(a, None, where, f, project):
                return True
    return False


def _local_name(m: ModuleInfo, where: tuple[str, str], project: Project) -> str | None:
    """The name module `m` imports the global `where` (module, name) under, if it does."""
    for alias in m.imports:
        found = project.binding(m, alias) if not alias.startswith("*") else None
        if found is not None and (found[0].name, found[1]) == where:
            return alias
    found = project.binding(m, where[1])  # from .defaults import *
    return where[1] if found is not None and found[0] is not m and (found[0].name, found[1]) == where else None


def _bound_otherwise(name: str, fn: FunctionInfo) -> bool:
    """Whether `fn` binds `name` other than by a plain assignment: a loop or comprehension variable, or a target
    of unpacking (``ws, n = sizes()``)."""
    if name in fn.loop_vars:
        return True
    for a in fn.assigns:
        targets = a.targets if isinstance(a, ast.Assign) else [a.target]
        for t in targets:
            if isinstance(t, ast.Tuple | ast.List) and any(
                isinstance(n, ast.Name) and n.id == name for n in ast.walk(t)
            ):
                return True
    return False


def _is_table(expr: ast.expr, local: str | None, where: tuple[str, str], f: FunctionInfo, project: Project) -> bool:
    """Whether `expr` is the table: the name it has in `f`'s module, or ``module.TABLE`` of a module that binds it."""
    if isinstance(expr, ast.Name):
        return expr.id == local
    if isinstance(expr, ast.Attribute):
        root = expr.value
        while isinstance(root, ast.Attribute):
            root = root.value
        if not (isinstance(root, ast.Name) and root.id in f.module.imports):
            return False  # self.bufs[k] = v: no module's global
        owner = project.resolve_def(expr.value, f)
        found = project.binding(owner, expr.attr) if isinstance(owner, ModuleInfo) else None
        return found is not None and (found[0].name, found[1]) == where
    return False


def _is_env(expr: ast.expr) -> bool:
    """An environment read: ``os.getenv("WS")``, ``os.environ.get("WS")``, ``int(...)`` of one."""
    if isinstance(expr, ast.Call) and dotted(expr.func) == "int" and len(expr.args) == 1:
        return _is_env(expr.args[0])
    return isinstance(expr, ast.Call) and dotted(expr.func) in _ENV_GETTERS


def _attribute_constant(expr: ast.Attribute, fn: FunctionInfo, project: Project, depth: int) -> bool:
    """``config_module.WORKSPACE_BYTES`` or ``global_config.flashinfer_workspace_size`` bound once to a constant."""
    base = project.resolve_def(expr.value, fn)
    if isinstance(base, ModuleInfo):  # config_module.WS, also one its package's __init__.py re-exports
        bound = _module_value(base, expr.attr, project)
        if bound is not None:
            return _is_constant(bound[0], bound[1], project, depth + 1)
        # else `from radix import global_config` may name the object the package's __init__.py binds over the
        # submodule of that name (`from .global_config import global_config`): an instance, read below
    if expr.attr == "value" and isinstance(expr.value, ast.Attribute):  # WsSize.DECODE.value
        inner = project.resolve_def(expr.value.value, fn)
        if isinstance(inner, ClassInfo):
            return _attribute_constant(expr.value, fn, project, depth + 1)
    held = _namespace_field(expr, fn, project)
    if held is not None:  # flashinfer_defaults.workspace_bytes of a module-level SimpleNamespace(workspace_bytes=...)
        return _is_constant(held[0], held[1], project, depth + 1)
    cls = base if isinstance(base, ClassInfo) else project.instance_type(expr.value, fn)  # WsSize.DECODE, self.X
    if cls is None:
        return False
    if expr.attr in ("value", "_value_") and _is_enum(cls) and cls.attr_assigns:  # self.value in an enum's method
        members = [(v, where) for vals in cls.attr_assigns.values() for v, where in vals]
        return all(_is_constant(v, where, project, depth + 1) for v, where in members)
    classes = [cls, *cls.bases]
    if any(_constructor_field(c, expr.attr) for c in classes):
        return False  # a field's default is only what instances built without it hold: configuration
    assigns = [(v, where) for c in classes for v, where in c.attr_assigns.get(expr.attr, [])]
    return len(assigns) == 1 and _is_constant(assigns[0][0], assigns[0][1], project, depth + 1)


def _namespace_field(expr: ast.Attribute, fn: FunctionInfo, project: Project) -> tuple[ast.expr, FunctionInfo] | None:
    """The value a module-level ``SimpleNamespace(name=value)`` (read as a global or as ``module.ns``) holds under
    the attribute `expr` reads, where no code of the project stores that attribute name."""
    ns = expr.value
    if isinstance(ns, ast.Attribute):
        named = project.module_attribute(ns, fn)
        bound = _module_value(named[0], named[1], project) if named is not None else None
    elif isinstance(ns, ast.Name) and ns.id not in fn.local_assigns and ns.id not in fn.params:
        bound = _module_value(fn.module, ns.id, project)
    else:
        return None
    if bound is None or expr.attr in project.attr_stores:
        return None
    value, where = bound
    if not (isinstance(value, ast.Call) and (dotted(value.func) or "") in NAMESPACES):
        return None
    return next(((k.value, where) for k in value.keywords if k.arg == expr.attr), None)


def _is_enum(cls: ClassInfo) -> bool:
    """A class deriving from ``enum.Enum`` (``IntEnum``, ``Flag``...), directly or through project classes."""
    return any((dotted(b) or "").endswith(("Enum", "Flag")) for c in with_bases(cls) for b in c.node.bases)


def _constructor_field(cls: ClassInfo, attr: str) -> bool:
    """Whether `attr` is a field of a class whose constructor is generated from its fields (``@dataclass``,
    attrs, ``NamedTuple``, pydantic models): each instance may be built with another value (``from_args``,
    ``replace``, a caller passing it), so the class-body default is not a fixed size."""
    if attr not in cls.fields:
        return False
    for stmt in cls.node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == attr:
            ann = stmt.annotation.value if isinstance(stmt.annotation, ast.Subscript) else stmt.annotation
            if (terminal_name(ann) or "") == "ClassVar":
                return False
    decorators = {terminal_name(d.func if isinstance(d, ast.Call) else d) for d in cls.node.decorator_list}
    bases = {terminal_name(b) for b in cls.node.bases}
    return bool(decorators & _FIELD_DECORATORS or bases & _FIELD_BASES)


_FIELD_DECORATORS = frozenset({"dataclass", "define", "frozen", "mutable", "attrs", "s"})
_FIELD_BASES = frozenset({"NamedTuple", "BaseModel", "BaseSettings", "Struct"})
_WORKSPACE_WORDS = frozenset({"workspace", "workspaces", "ws"})
_BUFFER_WORDS = frozenset({"buffer", "buffers", "buf", "bufs", "pool", "mem", "memory", "storage", "tensor"})
_ENV_GETTERS = frozenset({"os.environ.get", "os.getenv", "environ.get", "getenv"})
