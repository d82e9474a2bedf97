"""Which containers a loop variable takes its items from (``for layer, kv in zip(self.layers, caches)``): read by
the typing, the value flow and the dataflow from the loops `flashcheck.verifier.index` records per function."""

from __future__ import annotations

import ast

from flashcheck.verifier.astutil import dotted
from flashcheck.verifier.index import FunctionInfo, Loop

__all__ = ["innermost_loop", "loop_containers"]


def innermost_loop(loops: list[Loop], line: int) -> list[Loop]:
    """Of the loops that bind a name, the innermost one whose lines hold `line` (empty when none does)."""
    around = [loop for loop in loops if loop[2] <= line <= loop[3]]
    return [min(around, key=lambda loop: loop[3] - loop[2])] if around else []


def loop_containers(name: str, fn: FunctionInfo, line: int | None = None) -> list[ast.expr] | None:
    """The containers whose items the loop variable `name` holds, one per loop that binds it, or only the innermost
    loop around `line` when given (None when one of them is not known): ``X`` for ``for v in X``, ``for i, v in
    enumerate(X)``, ``for k, v in X.items()``, ``for v in X.values()``, the matching argument of ``zip(A, B, ...)``
    (nested tuple targets too), through a local name bound once (``groups = zip(...)``)."""
    loops = fn.loop_items.get(name)
    if not loops or name in fn.params or name in fn.local_assigns:
        return None
    if line is not None:
        loops = innermost_loop(loops, line)
        if not loops:
            return None
    found = [_container(it, path, fn) for it, path, _, _ in loops]
    return [c for c in found if c is not None] if all(c is not None for c in found) else None


def _container(it: ast.expr, path: tuple[int, ...], fn: FunctionInfo) -> ast.expr | None:
    for _ in range(4):
        if path and isinstance(it, ast.GeneratorExp | ast.ListComp | ast.List | ast.Tuple):
            picked = _position(it, path[0])  # for dev, host in ((self.a[g], self.a_cpu[g]) for g in groups): dev is
            if picked is None:  # an a[g], each item of a tuple of the tuples' first items
                return None
            it, path = picked, path[1:]
            continue
        if isinstance(it, ast.Name) and it.id not in fn.params:
            values = fn.local_assigns.get(it.id)
            if not values or len(values) != 1:
                return it if not values and not path else None
            it = values[0]
            continue
        if not isinstance(it, ast.Call):
            return it if not path else None
        name_of = dotted(it.func)
        if name_of in ("enumerate", "reversed", "sorted", "list", "tuple") and it.args:
            if name_of == "enumerate":
                if not path or path[0] != 1:
                    return None
                path = path[1:]
            it = it.args[0]
            continue
        if name_of == "zip" and path and path[0] < len(it.args):
            it, path = it.args[path[0]], path[1:]
            continue
        if isinstance(it.func, ast.Attribute) and it.func.attr in ("items", "values") and not it.args:
            if it.func.attr == "items":
                if not path or path[0] != 1:
                    return None
                path = path[1:]
            it = it.func.value
            continue
        return it if not path else None  # the result of another call (num = self._verify(...)) is the container
    return None


def _position(it: ast.GeneratorExp | ast.ListComp | ast.List | ast.Tuple, i: int) -> ast.Tuple | None:
    """A tuple of item `i` of each tuple a comprehension makes or a literal holds (made once per position, kept on
    `it`); None where some item is no tuple literal that holds position `i`."""
    rows = [it.elt] if isinstance(it, ast.GeneratorExp | ast.ListComp) else list(it.elts)
    picked = [
        r.elts[i]
        for r in rows
        if isinstance(r, ast.Tuple) and i < len(r.elts) and not any(isinstance(e, ast.Starred) for e in r.elts)
    ]
    if not rows or len(picked) != len(rows):
        return None
    made: ast.Tuple | None = it.__dict__.get(f"_flashcheck_position_{i}")
    if made is None:
        made = it.__dict__[f"_flashcheck_position_{i}"] = ast.copy_location(ast.Tuple(picked, ast.Load()), it)
    return made
