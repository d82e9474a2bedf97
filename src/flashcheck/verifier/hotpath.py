"""Hot-path roots and what is reachable from them.

A root is a function that runs every step or before every graph replay (kind ``step``), or while CUDA graphs are
captured (kind ``capture``). Roots come from configuration, from the ``@flashcheck.hot_path`` decorator, and from
default name patterns of serving engines (see `default_category`). Reachability is a breadth-first walk of the call
graph (plus calls through callables kept in attributes and locals: bound methods, ``functools.partial``; and reads of
``@property`` attributes, which run the getter) that keeps the class of ``self`` along a path, so that a base class's
``self.hook()`` runs the override of the root's class, not a sibling's, and that leaves out the branches a call's
constant arguments rule out (`flashcheck.verifier.guards`); each reachable function keeps its shortest call chain
from a root, and findings print that chain.
"""

from __future__ import annotations

import ast
import fnmatch
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from flashcheck.findings import Frame
from flashcheck.verifier.astutil import class_base, is_protocol, literal_items, name_tokens, terminal_name
from flashcheck.verifier.capture_blocks import around, graph_blocks, outside_capture
from flashcheck.verifier.config import StaticConfig
from flashcheck.verifier.dataflow import arg_for_param
from flashcheck.verifier.flashinfer_api import (
    PLAN_METHODS,
    is_wrapper_class_name,
    looks_like_wrapper,
    module_imports_flashinfer,
)
from flashcheck.verifier.guards import Bindings, Dead, Guards, Handed
from flashcheck.verifier.index import owner_of, with_bases
from flashcheck.verifier.loops import loop_containers
from flashcheck.verifier.project import ClassInfo, FunctionInfo, Project, imported_name
from flashcheck.verifier.tables import ruled_out_by_key

__all__ = ["Category", "HotPaths", "Root", "RootKind", "default_category"]

RootKind = Literal["step", "capture"]
Category = Literal["replay", "metadata", "plan", "capture", "configured", "decorator"]
_KIND: dict[Category, RootKind] = {
    "replay": "step",
    "metadata": "step",
    "plan": "step",
    "configured": "step",
    "decorator": "step",
    "capture": "capture",
}
_BY_KIND: dict[RootKind, frozenset[Category]] = {
    kind: frozenset(c for c, k in _KIND.items() if k == kind) for kind in ("step", "capture")
}
# Categories whose code prepares the per-step metadata of a graph: writing a graph-bound buffer there is the intended
# way to update it (FC104 allows it); capture code also runs the model forward, so it does not count.
METADATA_CATEGORIES: frozenset[Category] = frozenset({"replay", "metadata", "plan"})


# Words that make a function with ``plan`` in its name a helper around plans, not a plan (stats, benchmarks, tests).
_NOT_PLAN_WORDS = frozenset(
    {
        "stats",
        "stat",
        "statistics",
        "log",
        "benchmark",
        "bench",
        "profile",
        "debug",
        "dump",
        "print",
        "report",
        "test",
        "timing",
        "metrics",
        "explain",
        "describe",
    }
)


@dataclass(frozen=True)
class Root:
    fn: FunctionInfo
    category: Category
    why: str
    outside: Dead | None = None  # the parts of `fn` that do not run in the root's role (outside its capture block)

    @property
    def kind(self) -> RootKind:
        return _KIND[self.category]


@dataclass(frozen=True)
class Hop:
    """How a function was reached: from `parent` through a call on `line` (None for the root itself); `via` is how
    the parent itself was reached on that path."""

    parent: FunctionInfo | None
    line: int
    root: Root
    via: Hop | None = None


def default_category(fn: FunctionInfo, project: Project | None = None) -> Category | None:
    """Built-in engine patterns (matched on whole words of the name, so ``explanation`` is not a plan).

    - ``capture``: a word ``capture`` (``capture_one_batch_size``, ``init_forward_metadata_capture_cuda_graph``,
      ``build_for_cudagraph_capture``).
    - ``replay``: a word ``replay`` (``replay``, ``replay_prepare``, ``init_forward_metadata_replay_cuda_graph``),
      or ``prepare*cuda_graph*`` (rtp-llm's ``prepare_cuda_graph``).
    - ``metadata``: ``init_forward_metadata*``; ``build``/``build_*`` of a class named ``*Builder*``/``*Metadata*``
      (vLLM's ``AttentionMetadataBuilder.build``); a function with a word ``metadata`` or ``meta`` in its name that
      plans a FlashInfer wrapper (chitu's ``prepare_metadata_for_decode``, `_calls_wrapper_plan`).
    - ``plan``: a word ``plan`` (``plan``, ``fast_decode_plan``, ``_plan_prefill``) where the function plans
      attention (`_plans_attention`), or ``begin_forward``, unless another word says the function observes plans
      rather than makes them (``log_plan_stats``, ``benchmark_plan``, ``plan_statistics``).
    Functions in tests and benchmarks (`SourceFile.is_tooling`) are never default roots.
    """
    name = fn.name
    if name == "<module>":
        return None
    words = name_tokens(name)
    if "capture" in words:
        return "capture"
    lowered = name.lower()
    if "replay" in words or fnmatch.fnmatch(lowered, "prepare*cuda*graph*"):
        return "replay"
    if lowered.startswith("init_forward_metadata"):
        return "metadata"
    if (name == "build" or name.startswith("build_")) and fn.cls is not None:
        cls_words = name_tokens(fn.cls.name)
        if "builder" in cls_words or "metadata" in cls_words:
            return "metadata"
    if name == "begin_forward" or ("plan" in words and not words & _NOT_PLAN_WORDS and _plans_attention(fn, words)):
        return "plan"
    if words & {"metadata", "meta"} and _calls_wrapper_plan(fn, words, project):
        return "metadata"
    return None


# The exploration key of a root explored only inside its capture blocks (`outside_capture`).
_CAPTURE_BLOCK: Bindings = frozenset({("<capture block>", None)})

# Words of a function that plans once (set-up, warm-up, a constructor), not before every step.
_ONCE_WORDS = frozenset(
    {
        *("init", "initialize", "initialise", "setup", "warmup", "warm", "once", "create", "load", "profile"),
        *("profiling", "dummy", "alloc", "allocate", "reserve", "register"),
    }
)


def _calls_wrapper_plan(fn: FunctionInfo, words: frozenset[str], project: Project | None = None) -> bool:
    """Whether a function plans a FlashInfer wrapper (``self.mla_wrapper.plan(...)``,
    ``decode_wrappers[i].begin_forward(...)``, ``fast_decode_plan(w, ...)``); with a metadata word in its name it
    prepares a step's attention metadata (chitu's ``prepare_metadata_for_decode``); not a constructor, a one-time
    set-up or warm-up, or a helper around plans (stats, benchmarks), nor a plan of a project class that is no
    FlashInfer wrapper (a LoRA manager's ``self.punica_wrapper.plan(...)``)."""
    if fn.name.startswith("__") or words & (_ONCE_WORDS | _NOT_PLAN_WORDS):
        return False
    for c in fn.calls:
        f = c.func
        if isinstance(f, ast.Attribute) and f.attr in PLAN_METHODS and looks_like_wrapper(f.value):
            own = project.instance_type(f.value, fn) if project is not None else None
            if own is None or _may_be_flashinfer(own, project):  # not the engine's own *Wrapper with a plan()
                return True
        if isinstance(f, ast.Name) and f.id in PLAN_METHODS and f.id.startswith("fast_"):  # fast_decode_plan(w, ...)
            return True
    return False


def _plans_attention(fn: FunctionInfo, words: frozenset[str]) -> bool:
    """Whether a function named like a plan plans attention (FlashInfer's ``plan()`` runs every step), rather than
    something an engine re-plans now and then (an expert placement, a memory layout): it is named ``plan`` itself,
    its module imports FlashInfer, or it calls a plan (``self.wrapper.plan(...)``, ``self._plan_decode(...)``)."""
    if words == {"plan"} or module_imports_flashinfer(fn.module.imports.values()):
        return True
    return any(
        (n := terminal_name(c.func)) is not None and ("plan" in name_tokens(n) or n == "begin_forward")
        for c in fn.calls
    )


def find_roots(project: Project, config: StaticConfig) -> list[Root]:
    roots: list[Root] = []
    for fn in project.functions:
        root = _named_root(fn, project, config)
        if root is not None:
            roots.append(root)
        # a function that captures inline is a capture root for its blocks' bodies, whatever else it is
        if config.default_roots and not fn.source.is_tooling and (root is None or root.kind != "capture"):
            outside = outside_capture(fn)
            if outside is not None:
                roots.append(Root(fn, "capture", "captures a CUDA graph (with torch.cuda.graph(...))", outside))
    return roots


def _named_root(fn: FunctionInfo, project: Project, config: StaticConfig) -> Root | None:
    """The root a decorator, the configuration or a default pattern makes of `fn`, if any."""
    if any(terminal_name(d) == "hot_path" for d in fn.decorators):
        return Root(fn, "decorator", "decorated with @hot_path")
    names = (fn.qualname, fn.short, fn.name)
    pat = _first_match(names, config.capture_paths)
    if pat is not None:
        return Root(fn, "capture", f"matches capture-paths pattern {pat!r}")
    pat = _first_match(names, config.replay_prep_paths)
    if pat is not None:
        return Root(fn, "replay", f"matches replay-prep-paths pattern {pat!r}")
    pat = _first_match(names, config.hot_paths)
    if pat is not None:
        # A configured root that the defaults know as metadata preparation keeps that meaning for FC104.
        cat = default_category(fn, project) if config.default_roots else None
        keep: Category = cat if cat is not None and cat in METADATA_CATEGORIES else "configured"
        return Root(fn, keep, f"matches hot-paths pattern {pat!r}")
    if config.default_roots and not fn.source.is_tooling:  # a test named test_replay_* is not a replay
        cat = default_category(fn, project)
        if cat is not None:
            return Root(fn, cat, f"name matches the default {cat} pattern")
    return None


def _first_match(names: Iterable[str], patterns: Iterable[str]) -> str | None:
    for pat in patterns:
        if any(fnmatch.fnmatchcase(n, pat) for n in names):
            return pat
    return None


class HotPaths:
    """Roots plus lazily computed reachability per kind and per category set."""

    def __init__(self, project: Project, roots: list[Root]) -> None:
        self.project = project
        self.roots = roots
        self._cache: dict[frozenset[Category], dict[FunctionInfo, Hop]] = {}
        self._deads: dict[frozenset[Category], dict[int, list[Dead | None]]] = {}
        self._resolved: dict[int, set[tuple[int, int]]] = {}
        self._guards = Guards(project.used_as_value, project.resolve_def, self._handed_callables, self._stored_fields)
        self._stored: frozenset[str] | None = None
        self._blocks: dict[int, list[tuple[ast.With, list[ast.stmt]]]] = {}  # graph_blocks, by id(fn)
        self._edge_cache: dict[tuple[int, int], list[tuple[FunctionInfo, ast.expr, ClassInfo | None]]] = {}

    def around_capture(self, fn: FunctionInfo, node: ast.AST, *, sync: bool) -> bool:
        """Whether `node` of `fn` is captured (in the body of a ``with torch.cuda.graph(g):`` block of `fn`) or, for
        a `sync`, sits beside such a block (in the first-sight branch that holds it); the blocks are found once."""
        blocks = self._blocks.get(id(fn))
        if blocks is None:
            blocks = self._blocks[id(fn)] = graph_blocks(fn)
        return bool(blocks) and around(blocks, fn, node, sync)

    def reach(self, kind: RootKind) -> dict[FunctionInfo, Hop]:
        """Functions reachable from roots of `kind`, each with its first (shortest) hop."""
        return self.reach_categories(_categories(kind))

    def live(self, fn: FunctionInfo, node: ast.AST, kind: RootKind) -> bool:
        """Whether `node` of `fn` runs on some path from a root of `kind`: not when every path that reaches `fn`
        passes constants that rule its branch out (``if not skip_prefill:`` under ``skip_prefill=True``)."""
        self.reach(kind)
        found = self._deads[_categories(kind)].get(id(fn))
        return not found or any(d is None or node not in d for d in found)

    def reach_categories(self, categories: frozenset[Category]) -> dict[FunctionInfo, Hop]:
        """Functions reachable from roots in `categories`, each with its first (shortest) hop.

        The walk knows the class of ``self`` along a path: a root's own class, kept through ``self.method()`` into
        inherited methods and through ``super().method()``. ``self.hook()`` in a base class's method then runs the
        override of that class (and of its subclasses), not a sibling's: a replay root of the FlashInfer backend
        that runs a shared base helper does not reach the Triton backend's ``update_decode``. A receiver of
        unknown class runs every override, as before. It also knows the constant arguments of a call
        (`flashcheck.verifier.guards`): ``_dummy_run(skip_eplb=True)`` does not reach what ``_dummy_run`` calls
        under ``if not skip_eplb:``."""
        cached = self._cache.get(categories)
        if cached is not None:
            return cached
        seen: dict[FunctionInfo, Hop] = {}
        # id(fn) -> (class of self, bindings) it was explored with; class 0: generic, bindings None: none
        explored: dict[int, set[tuple[int, Bindings | None]]] = {}
        deads: dict[int, list[Dead | None]] = self._deads.setdefault(categories, {})
        queue: deque[tuple[FunctionInfo, ClassInfo | None, Hop, Bindings, Dead]] = deque()

        def visit(
            fn: FunctionInfo,
            ctx: ClassInfo | None,
            hop: Hop,
            bound: Bindings = frozenset(),
            outside: Dead | None = None,
        ) -> None:
            own = owner_of(fn).cls
            key = 0 if ctx is own or ctx is None else id(ctx)
            done = explored.setdefault(id(fn), set())
            dead = self._guards.dead(fn, bound) if outside is None else outside
            bound = self._guards.useful(fn, bound, dead)
            if key and len({k for k, _ in done}) >= _MAX_SELF_CLASSES:
                key, ctx = 0, own
            if bound and len(done) >= _MAX_BINDINGS:
                bound, dead = frozenset(), Dead()
            bkey = bound or (_CAPTURE_BLOCK if outside is not None else None)
            if (0, None) in done or (key, None) in done or (key, bkey) in done:
                return  # explored with the same class of self and bindings, or more generally
            done.add((key, bkey))
            deads.setdefault(id(fn), []).append(dead if bkey is not None else None)
            seen.setdefault(fn, hop)
            queue.append((fn, ctx, hop, bound, dead))

        for r in self.roots:
            if r.category in categories:
                visit(r.fn, owner_of(r.fn).cls, Hop(None, r.fn.line, r), outside=r.outside)
        while queue:
            fn, ctx, hop, bound, dead = queue.popleft()
            outer = dict(bound)
            for callee, node, self_ctx in self._edges(fn, ctx):
                if node in dead:
                    continue  # in a branch the constant arguments of this path rule out
                if outer and isinstance(node, ast.Call) and ruled_out_by_key(self.project, fn, node, callee, outer):
                    continue  # a table item stored under a key the path's constants rule out
                handed = (
                    outer.get(node.func.id) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else None
                )
                if isinstance(handed, Handed) and id(callee) not in handed.ids:
                    continue  # attend(q): a closure another path hands this parameter
                callee_ctx = _narrowed(callee, self_ctx)
                args: Bindings = frozenset()
                if isinstance(node, ast.Call) and self._direct(fn, node, callee):
                    args = self._guards.bindings(node, callee, outer, fn)
                visit(callee, callee_ctx, Hop(fn, node.lineno, hop.root, hop), args)
        self._cache[categories] = seen
        return seen

    def _handed_callables(self, arg: ast.expr, fn: FunctionInfo) -> list[FunctionInfo]:
        return self.project.callables(arg, fn, partials=True)

    def _stored_fields(self) -> frozenset[str]:
        """Attribute names some code stores after an object is built (outside constructors' ``self.x = ...``, also by
        ``setattr`` with a literal name): such a field's constructor keyword says nothing of its later value."""
        if self._stored is None:
            names: set[str] = set()
            for f in self.project.all_functions():
                building = f.name in ("__init__", "__post_init__", "__new__")
                for a in f.attributes:
                    own = isinstance(a.value, ast.Name) and a.value.id == "self"
                    if not isinstance(a.ctx, ast.Load) and not (building and own):
                        names.add(a.attr)
                for c in f.calls:
                    key = (
                        c.args[1]
                        if isinstance(c.func, ast.Name) and c.func.id == "setattr" and len(c.args) >= 2
                        else None
                    )
                    if isinstance(key, ast.Constant) and isinstance(key.value, str):
                        names.add(key.value)
            self._stored = frozenset(names)
        return self._stored

    def _direct(self, fn: FunctionInfo, call: ast.Call, callee: FunctionInfo) -> bool:
        """A call whose arguments fill the callee's parameters as written: the call graph's own edge to the callee
        by its name, to a constructed class's ``__init__``, or to the ``forward`` (``__call__``) of an object called
        (``layer(h, capturing)``); not an alias or a ``functools.partial`` (whose arguments are shifted), nor a
        method that an instance attribute of the same name may shadow."""
        name = terminal_name(call.func)
        built = callee.name == "__init__" and name is not None and name[:1].isupper()
        called = callee.name in ("__call__", "forward") and callee.cls is not None  # layer(h): the object's forward
        if not (name == callee.name or built or called):
            return False
        cls = owner_of(callee).cls
        if cls is not None and any(callee.name in c.attr_assigns for c in with_bases(cls)):
            return False
        resolved = self._resolved.get(id(fn))
        if resolved is None:
            resolved = self._resolved[id(fn)] = {(id(c), id(node)) for c, node in self.project.callees(fn)}
        return (id(callee), id(call)) in resolved

    def _edges(self, fn: FunctionInfo, ctx: ClassInfo | None) -> list[tuple[FunctionInfo, ast.expr, ClassInfo | None]]:
        """What `fn` runs when ``self`` is an instance of `ctx`: each callee with the node that runs it and the class
        of ``self`` it passes on (`ctx` for calls on ``self`` and ``super()``, the receiver's class for a call on an
        object whose class is known, None otherwise). Memoised per function and class: a walk explores a function
        once per set of constant arguments too, and asks again each time."""
        key = (id(fn), id(ctx))
        found = self._edge_cache.get(key)
        if found is None:
            cuts = self.project.cuts
            found = self._edges_uncached(fn, ctx)
            if self.project.cuts == cuts:  # not cut short by a recursion guard (asked again, it may know more)
                self._edge_cache[key] = found
        return found

    def _edges_uncached(
        self, fn: FunctionInfo, ctx: ClassInfo | None
    ) -> list[tuple[FunctionInfo, ast.expr, ClassInfo | None]]:
        own = owner_of(fn).cls
        narrow = ctx is not None and ctx is not own
        out: list[tuple[FunctionInfo, ast.expr, ClassInfo | None]] = []
        allowed: dict[str, set[int]] = {}
        runs = [*self.project.callees(fn), *self.project.property_reads(fn), *self.project.property_writes(fn)]
        for callee, node in runs:
            name = _self_member(node)
            if name is not None and callee.name in ("__call__", "forward") and callee.name != name:
                name = None  # self.patch(x): the forward of the object self holds, not a method of self
            if name is None:
                if _is_super_call(node) and ctx is not None and not self.project.super_runs(node, fn, ctx, callee):
                    continue  # super() in a mixin runs the next class of this object's order only
                out.append((callee, node, ctx if _is_super_call(node) else self._receiver(node, fn, callee)))
                continue
            if narrow and callee.name == name and owner_of(callee).cls is not None:
                assert ctx is not None
                if name not in allowed:
                    allowed[name] = {id(m) for m in self._dispatch(ctx, name)}
                if id(callee) not in allowed[name]:
                    continue  # a sibling's override: self is not an instance of its class
            out.append((callee, node, ctx))
        # self._forward_method(x) after self._forward_method = self.dispatch_forward(): a method of this object
        out.extend((callee, node, ctx if _self_member(node) else None) for callee, node in self._alias_callees(fn))
        out.extend((callee, node, None) for callee, node in self._decorator_wrappers(fn))
        return out

    def _receiver(self, node: ast.expr, fn: FunctionInfo, callee: FunctionInfo) -> ClassInfo | None:
        """The class of the object a call or attribute read runs on, when it is known (``self.backend.plan()`` with
        ``self.backend = FlashInferBackend(...)``; the object itself where it is called: ``self.patch(x)``)."""
        if isinstance(node, ast.Call):
            f = node.func
            if callee.name in ("__call__", "forward") and terminal_name(f) != callee.name:  # layer(h): its forward
                return self.project.instance_type(f, fn, 1)
            return self.project.instance_type(f.value, fn, 1) if isinstance(f, ast.Attribute) else None
        return self.project.instance_type(node.value, fn) if isinstance(node, ast.Attribute) else None

    def _dispatch(self, ctx: ClassInfo, name: str) -> list[FunctionInfo]:
        """The methods ``self.name`` may run on an instance of `ctx`: the one its class resolves, and overrides in its
        subclasses."""
        found = self.project.method(ctx, name)
        return ([found] if found is not None else []) + list(self.project.overrides(ctx, name))

    def _decorator_wrappers(self, fn: FunctionInfo) -> list[tuple[FunctionInfo, ast.expr]]:
        """The functions a project decorator puts around `fn`, which run whenever it is called: the closure that
        ``@timed`` returns, or that the decorator made by ``@step_timer("decode")`` returns."""
        out: list[tuple[FunctionInfo, ast.expr]] = []
        for d in fn.decorators:
            for deco in self.project.callables(d, fn, partials=True):
                for r in deco.returns[:4]:
                    out.extend((w, d) for w in self.project.callables(r, deco) if w.parent is deco)
        return out

    def _alias_callees(self, fn: FunctionInfo) -> list[tuple[FunctionInfo, ast.Call]]:
        """Project functions called through an alias the call graph does not resolve: a bound method or function
        kept in an attribute (``self._forward = self._forward_decode``), a ``functools.partial`` of one (in an
        attribute or a local), also chosen by a conditional expression; one handed in as an argument
        (``record(bucket, self._static_forward)`` calling ``forward()``); the entries of a dispatch table kept in an
        attribute (``self._handlers[fb.mode](...)`` with ``self._handlers = {Mode.DECODE: self._forward_decode}``);
        the items of a list a loop calls (``for hook in self._hooks: hook(meta)``, filled by ``append``)."""
        # a call resolved only to a typing.Protocol's stub (``step: StepFn``) still runs what the name holds
        resolved = {id(call) for callee, call in self.project.callees(fn) if not _protocol_stub(callee)}
        out: list[tuple[FunctionInfo, ast.Call]] = []
        cls = owner_of(fn).cls
        for call in fn.calls:
            f = call.func
            table = isinstance(f, ast.Subscript) and _self_member(f.value) is not None
            if id(call) in resolved or not (isinstance(f, ast.Name | ast.Attribute) or table):
                continue
            if table and cls is not None:  # self._handlers[mode](...): every entry of the table
                assert isinstance(f, ast.Subscript) and isinstance(f.value, ast.Attribute)
                held = [v for c in with_bases(cls) for v in c.attr_assigns.get(f.value.attr, [])]
                values = [(e, where) for d, where in held for e in literal_items(d)]
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self":
                values = [v for c in with_bases(cls) for v in c.attr_assigns.get(f.attr, [])] if cls else []
            elif isinstance(f, ast.Name) and f.id in fn.params and f.id not in fn.local_assigns:
                callers = self.project.feeding_callers(fn)[:16]
                values = [(a, caller) for caller, c in callers if (a := arg_for_param(c, fn, f.id)) is not None]
            elif isinstance(f, ast.Name) and f.id not in fn.local_assigns and f.id in fn.loop_vars:
                # for hook in self._pre_replay_hooks: hook(meta): each callable the list is seen to hold
                containers = loop_containers(f.id, fn, call.lineno) or fn.loop_vars[f.id]
                values = [v for c in containers[:4] for v in self.project.container_items(c, fn) or []]
                values = [(v, w) for v, w in values if fn.source.is_tooling or not w.source.is_tooling]  # not a test's
            elif isinstance(f, ast.Name):
                values = [(v, fn) for v in fn.local_assigns.get(f.id, [])]
            else:
                continue
            for value, where in values[:8]:
                for target in self.project.callables(value, where, partials=True):
                    out.append((target, call))
        return out

    @staticmethod
    def chain(fn: FunctionInfo, reach: dict[FunctionInfo, Hop]) -> list[Frame]:
        """Frames from the root's definition through each call site down to `fn` (innermost last)."""
        frames: list[Frame] = []
        hop: Hop | None = reach[fn]
        while hop is not None:
            p = hop.parent
            if p is None:
                root = hop.root.fn
                frames.append(Frame(root.source.relpath, root.line, root.short, root.source.line_text(root.line)))
                break
            frames.append(Frame(p.source.relpath, hop.line, p.short, p.source.line_text(hop.line)))
            hop = hop.via
        frames.reverse()
        return frames


def _categories(kind: RootKind) -> frozenset[Category]:
    return _BY_KIND[kind]


_MAX_SELF_CLASSES = 6  # classes of self one function is explored with before it is explored generically
_MAX_BINDINGS = 8  # explorations of one function before constant arguments are no longer told apart


def _protocol_stub(fn: FunctionInfo) -> bool:
    """A method of a ``typing.Protocol`` class: an interface, not the code a call runs."""
    return fn.cls is not None and is_protocol(fn.cls.node, fn.cls.module.imports)


def _self_member(node: ast.expr) -> str | None:
    """`name` of a call ``self.name(...)`` or a read ``self.name``."""
    f = node.func if isinstance(node, ast.Call) else node
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self":
        return f.attr
    return None


def _is_super_call(node: ast.expr) -> bool:
    """``super().name(...)``: the same object, so the class of ``self`` carries over."""
    f = node.func if isinstance(node, ast.Call) else None
    return (
        isinstance(f, ast.Attribute)
        and isinstance(f.value, ast.Call)
        and isinstance(f.value.func, ast.Name)
        and f.value.func.id == "super"
    )


def _narrowed(callee: FunctionInfo, ctx: ClassInfo | None) -> ClassInfo | None:
    """The class of ``self`` in `callee`: `ctx` when it is the callee's class or a subclass of it, else the callee's
    own class (generic)."""
    own = owner_of(callee).cls
    if own is None or ctx is None or ctx is own:
        return own
    return ctx if own in with_bases(ctx) else own


def _may_be_flashinfer(cls: ClassInfo, project: Project | None) -> bool:
    """Whether a project class a receiver is typed with may plan FlashInfer attention: an interface
    (``typing.Protocol``), a subclass of a wrapper (also imported under another name), or a class whose own ``plan``
    plans in turn (a thin wrapper holding one: ``self._inner.plan(...)``); not an engine's own ``PunicaWrapper`` with
    a ``plan()`` of its own."""
    if project is not None and project.is_protocol_class(cls):
        return True
    for c in with_bases(cls):
        for b in c.node.bases:
            base = class_base(b)
            full = imported_name(base, c.module.body, "flashinfer") if c.module.body is not None else None
            if is_wrapper_class_name(terminal_name(base) or "") or (full or "").startswith("flashinfer."):
                return True
        own = c.methods.get("plan") or c.methods.get("begin_forward")
        if own is not None and any(terminal_name(call.func) in PLAN_METHODS for call in own.calls):
            return True
    return False
