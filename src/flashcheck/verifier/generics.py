"""Generic project classes: what a method of ``BucketTable[int, GraphEntry]`` declares as one of its class's type
variables (``def __getitem__(self, key: K) -> V``, ``def get(self) -> TMeta``) is, for a receiver declared with type
arguments, the argument in that position (``GraphEntry``); also where a subclass fixes them in its bases (``class
DecodeSlot(MetadataSlot[DecodeMetadata])``). Also the declared annotations of expressions and of containers' items
that `flashcheck.verifier.instances` types objects by."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from flashcheck.verifier.astutil import annotation, item_annotation, terminal_name
from flashcheck.verifier.index import ClassInfo, FunctionInfo, with_bases

if TYPE_CHECKING:
    from flashcheck.verifier.instances import InstanceTyping

__all__ = ["declared_annotation", "declared_items", "generic_class", "type_params"]

_GENERIC_BASES = frozenset({"Generic", "Protocol"})
Declared = tuple[ast.expr, FunctionInfo]  # an annotation and the scope that resolves its names


def declared_annotation(project: InstanceTyping, expr: ast.expr, fn: FunctionInfo, depth: int) -> Declared | None:
    """The annotation `expr` is declared with: a local's or parameter's, an attribute's in the class of its object
    (``self.graphs: BucketTable[int, GraphEntry]``), with the scope that resolves its names."""
    if isinstance(expr, ast.Name):
        ann = fn.local_types.get(expr.id) or fn.params.get(expr.id)
        return (ann, fn) if ann is not None else None
    if isinstance(expr, ast.Attribute):
        for c in with_bases(project.instance_type(expr.value, fn, depth + 1)):
            if expr.attr in c.attr_types and c.module.body is not None:
                return c.attr_types[expr.attr], c.module.body
    return None


def declared_items(project: InstanceTyping, container: ast.expr, fn: FunctionInfo, depth: int) -> Declared | None:
    """The annotation of a container's items: ``X`` for one declared ``List[X]``/``Dict[K, X]``/``Optional[
    Sequence[X]]``, for items of items (``self.graph_runners[ve][bs]`` of ``List[Dict[int, X]]``), and the type
    argument a project class's ``__getitem__`` returns (``GraphEntry`` of ``BucketTable[int, GraphEntry]``)."""
    if depth > 6:
        return None
    if isinstance(container, ast.Subscript) and not isinstance(container.slice, ast.Slice):
        found = declared_items(project, container.value, fn, depth + 1)
    else:
        found = declared_annotation(project, container, fn, depth)
    if found is None:
        return None
    item = item_annotation(found[0])
    if item is not None:
        return item, found[1]
    head = annotation(found[0])
    cls = project._annotation_class(head.value, found[1], depth + 1) if isinstance(head, ast.Subscript) else None
    getter = project.method(cls, "__getitem__") if cls is not None else None
    returns = getattr(getter.node, "returns", None) if getter is not None else None
    arg = _bound(returns, getter, head) if getter is not None else None
    return (arg, found[1]) if arg is not None else None


def generic_class(
    project: InstanceTyping,
    declared: ast.expr | None,
    method: FunctionInfo,
    receiver: ast.expr,
    fn: FunctionInfo,
    depth: int,
) -> ClassInfo | None:
    """The class a type variable of `method`'s class that `declared` names (its return annotation, or the item
    annotation of what it returns) stands for, called on `receiver` in `fn`: by the receiver's declared type
    arguments, else by those a subclass of the receiver's class fixes in its bases. None otherwise."""
    cls = method.cls
    if cls is None or declared is None or not type_params(cls):
        return None
    found = declared_annotation(project, receiver, fn, depth)
    arg = _bound(declared, method, found[0]) if found is not None else None
    if arg is not None and found is not None:
        return project._annotation_class(arg, found[1], depth + 1)
    own = project.instance_type(receiver, fn, depth + 1)
    for c in with_bases(own) if own is not None and own is not cls else []:
        body = c.module.body
        for b in c.node.bases:
            if isinstance(b, ast.Subscript) and body is not None and project.resolve_def(b.value, body) is cls:
                arg = _bound(declared, method, b)
                return project._annotation_class(arg, body, depth + 1) if arg is not None else None
    return None


def type_params(cls: ClassInfo) -> list[str]:
    """The type variables of a generic class, in order: those of ``Generic[...]``/``Protocol[...]`` among its bases,
    else the module's ``TypeVar``s its subscripted bases use, in the order they first appear (``class
    Table(Dict[K, V])``); empty for a class that is not generic."""
    subscripted = [b for b in cls.node.bases if isinstance(b, ast.Subscript)]
    for b in subscripted:
        if terminal_name(b.value) in _GENERIC_BASES:
            return [e.id for e in _arguments(b) if isinstance(e, ast.Name)]
    body = cls.module.body
    out: list[str] = []
    for b in subscripted:
        for e in _arguments(b):
            if isinstance(e, ast.Name) and e.id not in out and body is not None and _is_typevar(e.id, body):
                out.append(e.id)
    return out


def _bound(declared: ast.expr | None, method: FunctionInfo, receiver: ast.expr | None) -> ast.expr | None:
    """The type argument `receiver` (an annotation: ``BucketTable[int, GraphEntry]``) gives for the type variable
    that `declared` names (``V``, ``Optional[V]``) in `method`'s class; None when `declared` is no type variable of
    that class or `receiver` gives no argument for it."""
    var = annotation(declared)
    cls = method.cls
    if cls is None or not isinstance(var, ast.Name):
        return None
    params = type_params(cls)
    ann = annotation(receiver)
    if var.id not in params or not isinstance(ann, ast.Subscript):
        return None
    args = _arguments(ann)
    return args[params.index(var.id)] if len(args) == len(params) else None


def _arguments(sub: ast.Subscript) -> list[ast.expr]:
    return list(sub.slice.elts) if isinstance(sub.slice, ast.Tuple) else [sub.slice]


def _is_typevar(name: str, body: FunctionInfo) -> bool:
    """Whether the module binds `name` to ``TypeVar(...)`` (also ``typing.TypeVar``)."""
    return any(isinstance(v, ast.Call) and terminal_name(v.func) == "TypeVar" for v in body.local_assigns.get(name, []))
