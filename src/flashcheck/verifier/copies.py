"""Copies that share fields with the object they copy.

``dataclasses.replace(obj, f=v)``, attrs' ``evolve(obj, f=v)`` and a NamedTuple's ``obj._replace(f=v)`` make an
object of ``obj``'s class (so the methods called on the copy are that class's). Its fields are ``obj``'s own objects,
except the ones passed and those its class's constructor makes afresh: a field declared ``init=False`` (not among the
class's constructor fields, `index.field_order`) and one that ``__post_init__`` (``__attrs_post_init__``) always
assigns. A write through a shared field of the copy writes the original's buffer; through a fresh one, a new buffer.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from flashcheck.verifier.astutil import dotted
from flashcheck.verifier.index import POST_INITS, ClassInfo, FunctionInfo, field_order, owner_of, with_bases

__all__ = ["PLAIN_COPIES", "copied", "field_through_copy", "fresh_in_copy"]

_EVOLVE = frozenset({"attr.evolve", "attrs.evolve"})
PLAIN_COPIES = frozenset({"copy.copy", "copy.deepcopy", "copy", "deepcopy"})  # an object of the copied one's class


def copied(
    value: ast.expr, fn: FunctionInfo, typer: Callable[[ast.expr, FunctionInfo], ClassInfo | None] | None = None
) -> tuple[ast.expr, frozenset[str] | None] | None:
    """``(the object copied, the fields passed)`` when `value` is such a copy made in `fn`; the fields are None when
    a ``**mapping`` passes some that cannot be named. With `typer`, ``x._replace(...)`` is no copy where the class
    of ``x`` defines a ``_replace`` method of its own (it is that method)."""
    if not isinstance(value, ast.Call):
        return None
    f = value.func
    if isinstance(f, ast.Attribute) and f.attr == "_replace" and not value.args:
        made = typer(f.value, fn) if typer is not None else None
        if made is not None and any("_replace" in b.methods for b in with_bases(made)):
            return None
        source: ast.expr = f.value
    elif value.args and (_imported_as(f, fn, "dataclasses.replace") or any(_imported_as(f, fn, e) for e in _EVOLVE)):
        source = value.args[0]
    else:
        return None
    names = [k.arg for k in value.keywords]
    return source, None if None in names else frozenset(n for n in names if n is not None)


def _imported_as(func: ast.expr, fn: FunctionInfo, target: str) -> bool:
    """``dataclasses.replace`` written in full, or its last name imported from its module (``from dataclasses import
    replace``)."""
    name = dotted(func) or ""
    if name == target or fn.module.imports.get(name) == target:  # also ``from dataclasses import replace as dc``
        return True
    head, _, last = target.rpartition(".")
    if name == last:
        return fn.module.imports.get(last) == target
    module, _, attr = name.rpartition(".")
    return attr == last and fn.module.imports.get(module, module) == head


def fresh_in_copy(cls: ClassInfo, attr: str) -> bool:
    """Whether a copy of an object of `cls` gets a new object for field `attr` from the constructor itself: a
    ``__post_init__`` of the class or a base always assigns it."""
    return any(_renews(m, attr) for c in with_bases(cls) for name, m in c.methods.items() if name in POST_INITS)


def _renews(method: FunctionInfo, attr: str) -> bool:
    """Whether `method` always sets ``self.<attr>``: an assignment, or ``object.__setattr__(self, "attr", ...)`` /
    ``setattr(self, "attr", ...)`` (a frozen dataclass's ``__post_init__``), outside every branch and loop (``if
    self.kv_indices is None: self.kv_indices = ...`` keeps what a copy passes)."""
    node = method.node
    todo = list(node.body) if not isinstance(node, ast.Module) else []
    while todo:
        stmt = todo.pop()
        if isinstance(stmt, ast.With | ast.AsyncWith | ast.Try):
            todo.extend(stmt.body)
            continue
        targets = (
            stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
        )
        if any(_is_self_attr(t, attr) for t in targets):
            return True
        call = stmt.value if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) else None
        if call is not None and dotted(call.func) in ("object.__setattr__", "setattr") and len(call.args) >= 2:
            name = call.args[1]
            if _is_self(call.args[0]) and isinstance(name, ast.Constant) and name.value == attr:
                return True
    return False


def _is_self(e: ast.expr) -> bool:
    return isinstance(e, ast.Name) and e.id == "self"


def _is_self_attr(target: ast.expr, attr: str) -> bool:
    return isinstance(target, ast.Attribute) and target.attr == attr and _is_self(target.value)


def field_through_copy(
    root: ast.Attribute, fn: FunctionInfo, typer: Callable[[ast.expr, FunctionInfo], ClassInfo | None] | None
) -> tuple[ast.expr, FunctionInfo] | bool | None:
    """For a field read from a copy (``scratch.kv_indices`` after ``scratch = dataclasses.replace(self.bufs)``, also
    kept as ``self.scratch``): the same field of the object copied, with the function that made the copy, when the
    copy shares it; False when the copy holds a new object there (passed, made by the constructor, or possibly passed
    in a ``**mapping``); None when `root` is not read from a copy."""
    holder, where = root.value, fn
    if isinstance(holder, ast.Name) and holder.id not in fn.params:
        values = fn.local_assigns.get(holder.id)
        holder = values[0] if values and len(values) == 1 else holder
    elif isinstance(holder, ast.Attribute) and isinstance(holder.value, ast.Name) and holder.value.id == "self":
        cls = owner_of(fn).cls
        kept = cls.attr_assigns.get(holder.attr, []) if cls is not None else []
        holder, where = kept[0] if len(kept) == 1 else (holder, fn)
    copy = copied(holder, where, typer)
    if copy is None:
        return None
    source, passed = copy
    if passed is None or root.attr in passed or root.attr.lstrip("_") in passed:  # attrs passes _x as x=
        return False
    made = typer(source, where) if typer is not None else None
    fields = field_order(made) if made is not None else []
    if made is not None and ((fields and root.attr not in fields) or fresh_in_copy(made, root.attr)):
        return False  # not a constructor field (init=False: made anew; no field: not the copy's), or renewed
    return ast.copy_location(ast.Attribute(value=source, attr=root.attr, ctx=ast.Load()), root), where
