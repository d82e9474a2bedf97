"""Items of tuples read by position: ``meta[SEQ_LENS]`` (an index that is a literal or a module's int constant),
``seq_d, seq_h = meta[SEQ_LENS]``, ``x, y, z = meta[2:5]`` and ``buf, n = self.helper()``, as the value flow reads
them: the item at that position of each tuple literal the container may be, through locals, returns and items of
items. Where some value the container may be is not a tuple literal of known length (a list that the code may
change, a tensor, a starred item before the position), every item speaks for it, as before. Part of
`flashcheck.verifier.provenance.flow.ValueFlow`."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from flashcheck.verifier.project import FunctionInfo, Project
from flashcheck.verifier.provenance.tensors import tuple_op_input

__all__ = ["PositionalItems", "Source"]

Source = tuple[ast.expr, FunctionInfo]
_MAX_HOPS = 4


class PositionalItems:
    """The positional-item half of `flashcheck.verifier.provenance.flow.ValueFlow`."""

    project: Project
    _unpacks: dict[int, dict[str, list[tuple[ast.expr, int]]]]

    if TYPE_CHECKING:

        def sources(self, expr: ast.expr, fn: FunctionInfo) -> list[Source]: ...

        def element_sources(self, container: ast.expr, fn: FunctionInfo, depth: int = 0) -> list[Source]: ...

    def unpacked(self, fn: FunctionInfo) -> dict[str, list[tuple[ast.expr, int]]]:
        """Names bound by unpacking a value that is not a literal tuple (``buf, n = self.helper()``): name ->
        (value, position)."""
        found = self._unpacks.get(id(fn))
        if found is None:
            found = self._unpacks[id(fn)] = {}
            for a in fn.assigns:
                if not isinstance(a, ast.Assign) or isinstance(a.value, ast.Tuple | ast.List):
                    continue
                for t in a.targets:
                    if isinstance(t, ast.Tuple | ast.List):
                        for i, elt in enumerate(t.elts):
                            if isinstance(elt, ast.Starred):
                                break
                            if isinstance(elt, ast.Name):
                                found.setdefault(elt.id, []).append((a.value, i))
        return found

    def item_of_result(self, value: ast.expr, i: int, fn: FunctionInfo, depth: int = 0) -> list[Source]:
        """Item `i` of the tuples `value` may be: a project function's ``return a, b``, a local tuple, item ``lo +
        i`` of what a constant slice ``meta[lo:hi]`` cuts, `x` for ``a, b = x.topk(k)`` (a torch operation's
        tensors share its input's device), or the element of a comprehension unpacked into names."""
        if isinstance(value, ast.Call) and (held := tuple_op_input(value, fn)) is not None:
            return [(held, fn)]
        if _is_vararg(value, fn):  # req_pool_indices, seq_lens, *rest = args: what the callers pass there
            return self.project.vararg_item(fn, i)
        if isinstance(value, ast.GeneratorExp | ast.ListComp):  # a, b = (torch.zeros(n, ...) for n in sizes): each
            return [(value.elt, fn)]  # item is the element
        if isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Slice):
            lo = _slice_start(value.slice, fn, self.project)
            at = self.positional_item(value.value, lo + i, fn) if lo is not None else None
            return at if at is not None else self.element_sources(value.value, fn)  # some item of the container
        out: list[Source] = []
        for src, where in self.sources(value, fn):
            if isinstance(src, ast.Name | ast.Attribute | ast.Call | ast.Subscript) and depth < 3:
                out.extend(self.item_of_result(src, i, where, depth + 1))
            if not isinstance(src, ast.Tuple | ast.List) or i >= len(src.elts):
                continue
            if not any(isinstance(e, ast.Starred) for e in src.elts[: i + 1]):
                out.append((src.elts[i], where))
        return out

    def indexed_sources(self, expr: ast.Subscript, fn: FunctionInfo) -> list[Source] | None:
        """``meta[2]``, ``meta[SEQ_LENS]``: the item at that position of every tuple `meta` may be; None when the
        index is no constant or some value is not a tuple literal that holds the position."""
        i = constant_index(expr.slice, fn, self.project)
        return self.positional_item(expr.value, i, fn) if i is not None else None

    def positional_item(self, container: ast.expr, i: int, fn: FunctionInfo, depth: int = 0) -> list[Source] | None:
        if depth > _MAX_HOPS:
            return None
        if _is_vararg(container, fn) and i >= 0:  # fb = args[0] of def __call__(self, *args, **kwargs)
            return self.project.vararg_item(fn, i) or None
        if isinstance(container, ast.Tuple):
            elts = container.elts
            if any(isinstance(e, ast.Starred) for e in elts) or not -len(elts) <= i < len(elts):
                return None
            return [(elts[i], fn)]
        if isinstance(container, ast.Subscript) and isinstance(container.slice, ast.Slice) and i >= 0:
            lo = _slice_start(container.slice, fn, self.project)  # meta[2:5][1] is meta[3]
            return self.positional_item(container.value, lo + i, fn, depth + 1) if lo is not None else None
        if not isinstance(container, ast.Name | ast.Attribute | ast.Subscript | ast.Call):
            return None
        found = self.sources(container, fn)
        if not found:
            return None
        out: list[Source] = []
        for src, where in found[:16]:
            at = self.positional_item(src, i, where, depth + 1)
            if at is None:
                return None
            out.extend(at)
        return out


def constant_index(key: ast.expr, fn: FunctionInfo, project: Project) -> int | None:
    """An int index known before the program runs: a literal (also negative) or a module global bound once to one
    (``SEQ_LENS = 2``, also imported from the project module that binds it)."""
    if isinstance(key, ast.Constant) and type(key.value) is int:
        return key.value
    if isinstance(key, ast.UnaryOp) and isinstance(key.op, ast.USub) and isinstance(key.operand, ast.Constant):
        v = key.operand.value
        return -v if type(v) is int else None
    if (
        isinstance(key, ast.Name)
        and key.id not in fn.local_assigns
        and key.id not in fn.params
        and key.id not in fn.loop_vars
    ):
        values = project.global_values(fn.module, key.id)
        if len(values) == 1 and isinstance(values[0][0], ast.Constant) and type(values[0][0].value) is int:
            return int(values[0][0].value)
    return None


def _slice_start(s: ast.Slice, fn: FunctionInfo, project: Project) -> int | None:
    """The start of a slice with unit step and a start known as a non-negative constant (0 where omitted)."""
    if s.step is not None:
        return None
    lo = constant_index(s.lower, fn, project) if s.lower is not None else 0
    return lo if lo is not None and lo >= 0 else None


def _is_vararg(expr: ast.expr, fn: FunctionInfo) -> bool:
    """`expr` is `fn`'s ``*args`` parameter, not bound again in `fn`."""
    vararg = getattr(getattr(fn.node, "args", None), "vararg", None)
    return (
        isinstance(expr, ast.Name) and vararg is not None and vararg.arg == expr.id and expr.id not in fn.local_assigns
    )
