"""The project class a project function returns, or the one its generator yields.

A call of a project function is typed by its return annotation (``-> AttnMetadata``, ``Optional[...]``), else by
what its ``return`` statements give when they all agree (``return AttnMetadata(...)``, a local built so). The items
of a loop over a call of a generator function (``for mb in self._split(batch)``) are typed by its annotation
(``Iterator[MicroBatch]``, ``Generator[MicroBatch, None, None]``, ``Iterable[...]``), else by the classes its own
``yield`` statements construct when they agree; what ``x = yield y`` receives by the send type of a ``Generator``
annotation (``Generator[Logits, Tuple[StepPlan, AttnMeta], None]``, item by item for ``plan, meta = yield y``).
Answers are memoised on the project per function.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from flashcheck.verifier.astutil import SCOPES, annotation, dotted, own_nodes
from flashcheck.verifier.astutil import terminal_name as terminal
from flashcheck.verifier.index import ClassInfo, FunctionInfo

if TYPE_CHECKING:
    from flashcheck.verifier.instances import InstanceTyping

__all__ = ["returned_class", "sent_class", "yielded_class", "yields_of"]

_ITERATORS = frozenset(
    f"{prefix}{name}"
    for prefix in ("", "typing.", "collections.abc.", "abc.", "t.")
    for name in ("Iterator", "Iterable", "Generator", "AsyncIterator", "AsyncIterable", "AsyncGenerator")
)
# answers are asked at one depth whatever the caller's, so that a memoised answer does not depend on who asked first
# (a function's own recursion guard bounds chains of calls)
_DEPTH = 3


def yields_of(fn: FunctionInfo) -> list[ast.expr]:
    """The values of the function's own ``yield`` statements (not those of nested functions); a bare ``yield``
    gives a None constant."""
    if isinstance(fn.node, ast.Module):
        return []
    nodes = (n for st in fn.node.body if not isinstance(st, SCOPES) for n in own_nodes(st))
    return [n.value if n.value is not None else ast.Constant(None) for n in nodes if isinstance(n, ast.Yield)]


def returned_class(project: InstanceTyping, fn: FunctionInfo) -> ClassInfo | None:
    """The class a call of `fn` returns (None for a generator, an unknown or a disagreeing return)."""
    key = ("return", id(fn))
    if key in project._return_types:
        return project._return_types[key]
    project._return_types[key] = None  # recursion guard
    found: ClassInfo | None = None
    if not isinstance(fn.node, ast.Module) and not yields_of(fn):
        ann = fn.node.returns
        found = project._annotation_class(ann, fn, _DEPTH) if ann is not None else None
        if found is None:  # no annotation, or one of a class outside the project (-> nn.Module): what it returns
            found = _agreeing(project, fn.returns, fn)
    project._return_types[key] = found
    return found


def yielded_class(project: InstanceTyping, fn: FunctionInfo) -> ClassInfo | None:
    """The class of the items a generator function `fn` yields (None when it is no generator or they differ)."""
    key = ("yield", id(fn))
    if key in project._return_types:
        return project._return_types[key]
    project._return_types[key] = None  # recursion guard
    found: ClassInfo | None = None
    yields = yields_of(fn)
    if yields and not isinstance(fn.node, ast.Module):
        ann = annotation(fn.node.returns)
        if isinstance(ann, ast.Subscript) and dotted(ann.value) in _ITERATORS:
            item = ann.slice.elts[0] if isinstance(ann.slice, ast.Tuple) and ann.slice.elts else ann.slice
            found = project._annotation_class(item, fn, _DEPTH)
        elif ann is None:
            found = _agreeing(project, yields, fn)
    project._return_types[key] = found
    return found


def _agreeing(project: InstanceTyping, values: list[ast.expr], fn: FunctionInfo) -> ClassInfo | None:
    """The one class the values (returned or yielded; None constants aside) are instances of, else None."""
    found: dict[int, ClassInfo] = {}
    for v in values[:8]:
        if isinstance(v, ast.Constant) and v.value is None:
            continue
        t = project._value_type(v, fn, _DEPTH)
        if t is None:
            return None
        found[id(t)] = t
    return next(iter(found.values())) if len(found) == 1 else None


def sent_class(project: InstanceTyping, fn: FunctionInfo, index: int | None) -> ClassInfo | None:
    """The class of what a generator function `fn` receives from ``send()``, by the send type of its ``Generator``
    annotation; with `index`, of that item of a ``Tuple[...]`` send type (``plan, meta = yield logits``)."""
    ann = annotation(getattr(fn.node, "returns", None))
    if not isinstance(ann, ast.Subscript) or (dotted(ann.value) or "").rsplit(".", 1)[-1] != "Generator":
        return None
    args = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else []
    sent = args[1] if len(args) > 1 else None
    if index is not None:
        inner = sent.slice if isinstance(sent, ast.Subscript) and terminal(sent.value) in ("Tuple", "tuple") else None
        items = inner.elts if isinstance(inner, ast.Tuple) else []
        sent = items[index] if index < len(items) and not _ellipsis(items) else None
    return project._annotation_class(sent, fn, _DEPTH) if sent is not None else None


def _ellipsis(items: list[ast.expr]) -> bool:
    return any(isinstance(e, ast.Constant) and e.value is Ellipsis for e in items)
