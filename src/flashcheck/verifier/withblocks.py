"""Where ``with`` statements run the ``__enter__`` and ``__exit__`` of project classes (a context manager that pads
or uploads a graph-bound buffer runs where its block begins and ends), and which plan of a function runs last before
a given line; FC104 judges such methods' writes at their blocks with these."""

from __future__ import annotations

import ast
from collections.abc import Callable

from flashcheck.verifier.index import FunctionInfo
from flashcheck.verifier.paths import runs_after, runs_before
from flashcheck.verifier.project import Project

__all__ = ["CM_METHODS", "last_plan_before", "with_sites"]

CM_METHODS = ("__enter__", "__exit__", "__aenter__", "__aexit__")
Sites = dict[int, tuple[FunctionInfo, list[tuple[FunctionInfo, int]]]]


def with_sites(project: Project, wanted: Callable[[FunctionInfo], bool]) -> Sites:
    """The ``__enter__``/``__exit__`` (``__aenter__``/``__aexit__``) methods of project classes that `wanted` accepts,
    by id, each with the functions whose ``with`` statements run it and the line where it runs (the ``with`` line for
    entering, the block's last line for leaving)."""
    methods = {
        id(m): m
        for c in project.classes.values()
        for name in CM_METHODS
        if (m := c.methods.get(name)) is not None and wanted(m)
    }
    out: Sites = {}
    for fn in project.all_functions() if methods else ():
        stack: list[ast.AST] = list(getattr(fn.node, "body", [])) if not isinstance(fn.node, ast.Module) else []
        while stack:
            node = stack.pop()
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
                continue  # a nested function is its own
            stack.extend(ast.iter_child_nodes(node))
            if not isinstance(node, ast.With | ast.AsyncWith):
                continue
            names = CM_METHODS[2:] if isinstance(node, ast.AsyncWith) else CM_METHODS[:2]
            for item in node.items:
                cls = project.instance_type(item.context_expr, fn)
                for name, line in zip(names, (node.lineno, node.end_lineno or node.lineno), strict=True):
                    method = project.method(cls, name) if cls is not None else None
                    if method is not None and id(method) in methods:
                        out.setdefault(id(method), (method, []))[1].append((fn, line))
    return out


def last_plan_before(fn: FunctionInfo, plans: list[int], line: int) -> int | None:
    """Of the lines of `fn` that plan, the last that runs before `line` on its path, when none may run after it."""
    later, earlier = runs_after(fn.node.body, line), runs_before(fn.node.body, line)
    if any(p > line and later(p) for p in plans):
        return None
    before = [p for p in plans if p <= line and (p == line or earlier(p))]
    return max(before) if before else None
