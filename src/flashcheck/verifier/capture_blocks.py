"""Where capture happens inside a function: its ``with torch.cuda.graph(g):`` blocks (also under an alias of
torch), the statements that run around each as often as it does, and the parts of the function outside them (an
eager warm-up before the block, the replay after it, the context managers the ``with`` enters). Part of
`flashcheck.verifier.hotpath`."""

from __future__ import annotations

import ast

from flashcheck.verifier.astutil import terminal_name
from flashcheck.verifier.guards import Dead
from flashcheck.verifier.index import FunctionInfo
from flashcheck.verifier.instances import torch_name
from flashcheck.verifier.project import imported_name

__all__ = ["around", "graph_blocks", "outside_capture"]


def graph_blocks(fn: FunctionInfo) -> list[tuple[ast.With, list[ast.stmt]]]:
    """The ``with torch.cuda.graph(g):`` blocks of `fn` (also under an alias of torch), each with the statements
    that run around it as often as it does: the branch of the innermost ``if`` that holds it (the first sight of a
    batch size), through ``with`` and ``try``, else the statements just before and after it."""
    if isinstance(fn.node, ast.Module) or not any(_captures(c, fn) for c in fn.calls):
        return []
    found: list[tuple[ast.With, list[ast.stmt]]] = []
    lists: list[tuple[list[ast.stmt], list[ast.stmt] | None]] = [(fn.node.body, None)]
    while lists:
        body, branch = lists.pop()
        for k, stmt in enumerate(body):
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue  # their own blocks belong to their own FunctionInfo
            if isinstance(stmt, ast.With) and any(
                isinstance(i.context_expr, ast.Call) and _captures(i.context_expr, fn) for i in stmt.items
            ):
                found.append((stmt, branch if branch is not None else body[max(k - 1, 0) : k + 2]))
                continue
            for field in ("body", "orelse", "finalbody"):
                inner = getattr(stmt, field, None)
                if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                    lists.append((inner, inner if isinstance(stmt, ast.If) else branch))
            lists.extend((h.body, branch) for h in getattr(stmt, "handlers", ()))
            lists.extend((c.body, c.body) for c in getattr(stmt, "cases", ()))
    return found


# The graph-capture context managers of torch's device modules (also the Ascend plugin's own module).
_GRAPH_CONTEXTS = frozenset({"torch.cuda.graph", "torch.cuda.graphs.graph", "torch.npu.graph", "torch.xpu.graph"})


def _captures(call: ast.Call, fn: FunctionInfo) -> bool:
    """``torch.cuda.graph(g)`` (or another device module's ``graph``), also under an alias (the name tested first:
    every call of the project passes)."""
    name = terminal_name(call.func) or ""
    renamed = fn.module.imports.get(name, "").endswith(".graph")
    if not (name == "graph" or renamed):
        return False
    plugin = imported_name(call.func, fn, "torch_npu") == "torch_npu.npu.graph"
    return plugin or torch_name(call.func, fn) in _GRAPH_CONTEXTS


def outside_capture(fn: FunctionInfo) -> Dead | None:
    """The parts of `fn` outside the bodies of its ``with torch.cuda.graph(g):`` blocks, when it has one: only what
    such a body runs is captured (an eager warm-up before it, the replay after it, and the context managers the
    ``with`` enters are not). None for a function without one."""
    blocks = sorted((b for b, _ in graph_blocks(fn)), key=lambda b: (b.lineno, b.col_offset))
    if not blocks:
        return None
    spans: list[tuple[int, int, int, int]] = []
    start = (0, 0)
    for b in blocks:
        spans.append((*start, *_captured_from(b, fn)))
        start = _end(b)
    spans.append((*start, 1 << 30, 0))
    return Dead(tuple(spans))


def around(blocks: list[tuple[ast.With, list[ast.stmt]]], fn: FunctionInfo, node: ast.AST, sync: bool) -> bool:
    """`HotPaths.around_capture` over the `graph_blocks` of `fn`."""
    at = (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))
    for block, branch in blocks:
        inside = _captured_from(block, fn) <= at <= _end(block)
        beside = sync and _start(branch[0]) <= at <= _end(branch[-1])
        if inside or beside:
            return True
    return False


def _captured_from(block: ast.With, fn: FunctionInfo) -> tuple[int, int]:
    """Where capture starts in a ``with`` block: at the item after the graph's (``with torch.cuda.graph(g),
    ctx():`` enters ``ctx`` while capturing), else at the body."""
    for i, item in enumerate(block.items[:-1]):
        expr = item.context_expr
        if isinstance(expr, ast.Call) and _captures(expr, fn):
            nxt = block.items[i + 1].context_expr
            return nxt.lineno, nxt.col_offset
    return _start(block.body[0])


def _start(stmt: ast.stmt) -> tuple[int, int]:
    return stmt.lineno, stmt.col_offset


def _end(last: ast.stmt) -> tuple[int, int]:
    return last.end_lineno or last.lineno, last.end_col_offset or 0
