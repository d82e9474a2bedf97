"""Items stored under string keys (``self.bufs[bs]["host"] = t``, ``{"metadata": m}["metadata"]``) as the value
flow reads them: the stores a keyed read may see, also through a local or a parameter bound to part of the chain.
Part of `flashcheck.verifier.provenance.flow.ValueFlow`."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from flashcheck.verifier.astutil import dotted
from flashcheck.verifier.index import with_bases
from flashcheck.verifier.itemkeys import keyed_lookup
from flashcheck.verifier.project import FunctionInfo, Project

__all__ = ["KeyedItems"]

Source = tuple[ast.expr, FunctionInfo]


class KeyedItems:
    """The keyed-item half of `flashcheck.verifier.provenance.flow.ValueFlow`."""

    project: Project

    if TYPE_CHECKING:

        def sources(self, expr: ast.expr, fn: FunctionInfo) -> list[Source]: ...

    def keyed_sources(self, expr: ast.Subscript, fn: FunctionInfo, depth: int = 0) -> list[Source]:
        """The values stored into an attribute under the string key `expr` reads (``self.d["decode"]``,
        ``self.bufs[bs]["host"]``); empty for another key or when no store is known."""
        at = keyed_lookup(expr.value, expr.slice.value) if isinstance(expr.slice, ast.Constant) else None
        if at is None and isinstance(expr.slice, ast.Constant) and isinstance(expr.slice.value, str):
            return self._rebased_keyed(expr, fn, depth) if depth < 2 else []
        cls = self.project.instance_type(at[0], fn) if at else None
        return [s for c in with_bases(cls) for k in (at[1] if at else []) for s in c.item_assigns.get(k, [])]

    def _rebased_keyed(self, expr: ast.Subscript, fn: FunctionInfo, depth: int) -> list[Source]:
        """`keyed_sources` of ``d[bs]["host"]`` where ``d`` is a local or a parameter bound to an item of an
        attribute (``d = self.bufs[mb]``, a caller passing ``self.bufs[mb]``): the same read on what it is bound
        to, ``self.bufs[mb][bs]["host"]``, in the code that binds it."""
        keys: list[ast.expr] = []
        root: ast.expr = expr.value
        while isinstance(root, ast.Subscript):
            keys.append(root.slice)
            root = root.value
        if not isinstance(root, ast.Name):
            return []
        out: list[Source] = []
        for v, where in self.sources(root, fn)[:8]:
            if not isinstance(v, ast.Attribute | ast.Subscript):
                continue
            rebuilt: ast.expr = v  # synthetic nodes over `v`: keyed_lookup reads them as syntax only
            for k in reversed(keys):
                rebuilt = ast.Subscript(rebuilt, k)
            out.extend(self.keyed_sources(ast.Subscript(rebuilt, expr.slice), where, depth + 1))
        return out

    def _keyed(self, container: ast.expr, key: str, fn: FunctionInfo) -> list[Source] | None:
        """The values stored under a string key when every dict the container may be is a literal or ``dict(...)``
        (``res["metadata"]`` of ``{"metadata": m, "output": t}`` is ``m``), or an item of an attribute whose stores
        under that key are known (``entry = self.bufs[mb][bs]``, then ``entry["host"]``); None when some dict is
        neither."""
        sources = self.sources(container, fn)
        if not sources:
            return None
        out: list[Source] = []
        for v, where in sources:
            if isinstance(v, ast.Dict) and all(k is not None for k in v.keys):  # not {**other, ...}
                pairs = zip(v.keys, v.values, strict=False)
                out.extend((item, where) for k, item in pairs if isinstance(k, ast.Constant) and k.value == key)
            elif isinstance(v, ast.Call) and dotted(v.func) == "dict" and not v.args:
                out.extend((kw.value, where) for kw in v.keywords if kw.arg == key)
            elif isinstance(v, ast.Subscript | ast.Attribute) and (
                stored := self.keyed_sources(ast.Subscript(v, ast.Constant(key)), where)
            ):
                out.extend(stored)
            else:
                return None
        return out or None  # a key the literals do not hold: stored later (d["k"] = v), read every item
