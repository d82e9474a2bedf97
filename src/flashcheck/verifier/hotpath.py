"""Hot-path roots and what is reachable from them.

A root is a function that runs every step or before every graph replay (kind ``step``), or while CUDA graphs are
captured (kind ``capture``). Roots come from configuration, from the ``@flashcheck.hot_path`` decorator, and from
default name patterns of serving engines (see `default_category`). Reachability is a breadth-first walk of the call
graph (plus calls through callables kept in attributes and locals: bound methods, ``functools.partial``; and reads of
``@property`` attributes, which run the getter), so each reachable function keeps its shortest call chain from a root;
findings print that chain.
"""

from __future__ import annotations

import ast
import fnmatch
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from flashcheck.findings import Frame
from flashcheck.verifier.astutil import name_tokens, terminal_name
from flashcheck.verifier.config import StaticConfig
from flashcheck.verifier.index import owner_of, with_bases
from flashcheck.verifier.project import FunctionInfo, Project

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

    @property
    def kind(self) -> RootKind:
        return _KIND[self.category]


@dataclass(frozen=True)
class Hop:
    """How a function was reached: from `parent` through a call on `line` (None for the root itself)."""

    parent: FunctionInfo | None
    line: int
    root: Root


def default_category(fn: FunctionInfo) -> Category | None:
    """Built-in engine patterns (matched on whole words of the name, so ``explanation`` is not a plan).

    - ``capture``: a word ``capture`` (``capture_one_batch_size``, ``init_forward_metadata_capture_cuda_graph``,
      ``build_for_cudagraph_capture``).
    - ``replay``: a word ``replay`` (``replay``, ``replay_prepare``, ``init_forward_metadata_replay_cuda_graph``),
      or ``prepare*cuda_graph*`` (rtp-llm's ``prepare_cuda_graph``).
    - ``metadata``: ``init_forward_metadata*``; ``build``/``build_*`` of a class named ``*Builder*``/``*Metadata*``
      (vLLM's ``AttentionMetadataBuilder.build``).
    - ``plan``: a word ``plan`` (``plan``, ``fast_decode_plan``, ``_plan_prefill``) or ``begin_forward``, unless
      another word says the function observes plans rather than makes them (``log_plan_stats``,
      ``benchmark_plan``, ``plan_statistics``).
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
    if ("plan" in words and not words & _NOT_PLAN_WORDS) or name == "begin_forward":
        return "plan"
    return None


def find_roots(project: Project, config: StaticConfig) -> list[Root]:
    roots: list[Root] = []
    for fn in project.functions:
        if any(terminal_name(d) == "hot_path" for d in fn.decorators):
            roots.append(Root(fn, "decorator", "decorated with @hot_path"))
            continue
        names = (fn.qualname, fn.short, fn.name)
        pat = _first_match(names, config.capture_paths)
        if pat is not None:
            roots.append(Root(fn, "capture", f"matches capture-paths pattern {pat!r}"))
            continue
        pat = _first_match(names, config.replay_prep_paths)
        if pat is not None:
            roots.append(Root(fn, "replay", f"matches replay-prep-paths pattern {pat!r}"))
            continue
        pat = _first_match(names, config.hot_paths)
        if pat is not None:
            # A configured root that the defaults know as metadata preparation keeps that meaning for FC104.
            cat = default_category(fn) if config.default_roots else None
            keep: Category = cat if cat is not None and cat in METADATA_CATEGORIES else "configured"
            roots.append(Root(fn, keep, f"matches hot-paths pattern {pat!r}"))
            continue
        if config.default_roots:
            cat = default_category(fn)
            if cat is not None:
                roots.append(Root(fn, cat, f"name matches the default {cat} pattern"))
    return roots


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

    def reach(self, kind: RootKind) -> dict[FunctionInfo, Hop]:
        """Functions reachable from roots of `kind`, each with its first (shortest) hop."""
        return self.reach_categories(frozenset(c for c, k in _KIND.items() if k == kind))

    def reach_categories(self, categories: frozenset[Category]) -> dict[FunctionInfo, Hop]:
        cached = self._cache.get(categories)
        if cached is not None:
            return cached
        seen: dict[FunctionInfo, Hop] = {}
        queue: deque[FunctionInfo] = deque()
        for r in self.roots:
            if r.category in categories and r.fn not in seen:
                seen[r.fn] = Hop(None, r.fn.line, r)
                queue.append(r.fn)
        while queue:
            fn = queue.popleft()
            hop = seen[fn]
            edges: list[tuple[FunctionInfo, ast.expr]] = [*self.project.callees(fn), *self._alias_callees(fn)]
            edges.extend(self.project.property_reads(fn))
            edges.extend(self._decorator_wrappers(fn))
            for callee, node in edges:
                if callee not in seen:
                    seen[callee] = Hop(fn, node.lineno, hop.root)
                    queue.append(callee)
        self._cache[categories] = seen
        return seen

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
        attribute or a local), also chosen by a conditional expression."""
        resolved = {id(call) for _, call in self.project.callees(fn)}
        out: list[tuple[FunctionInfo, ast.Call]] = []
        for call in fn.calls:
            f = call.func
            if id(call) in resolved or not isinstance(f, ast.Name | ast.Attribute):
                continue
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self":
                cls = owner_of(fn).cls
                values = [v for c in with_bases(cls) for v in c.attr_assigns.get(f.attr, [])] if cls else []
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
        cur: FunctionInfo | None = fn
        while cur is not None:
            hop = reach[cur]
            if hop.parent is None:
                frames.append(Frame(cur.source.relpath, cur.line, cur.short, cur.source.line_text(cur.line)))
                break
            p = hop.parent
            frames.append(Frame(p.source.relpath, hop.line, p.short, p.source.line_text(hop.line)))
            cur = p
        frames.reverse()
        return frames
