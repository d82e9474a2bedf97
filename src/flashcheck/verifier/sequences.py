"""What literal containers and comprehensions hold, for the typing of their items (`flashcheck.verifier.instances`):
the item expressions of literals, comprehensions and concatenations, what a function adds to a local list in bulk,
whether an attribute's container is also filled in bulk elsewhere (`grown`), the class an ``isinstance`` filter
narrows a comprehension's items to, and the names of a function whose value is more than what they were bound to
(`unstable_names`)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import TYPE_CHECKING

from flashcheck.verifier.astutil import dotted
from flashcheck.verifier.index import FunctionInfo, owner_of, with_bases

if TYPE_CHECKING:
    from flashcheck.verifier.instances import InstanceTyping

__all__ = ["bulk_growth", "fresh_list", "grown", "local_growth", "narrowed_class", "sequence_items", "unstable_names"]


def sequence_items(value: ast.expr, fn: FunctionInfo, depth: int = 0) -> list[ast.expr]:
    """The item expressions of a list, tuple or set literal, a comprehension, a concatenation of those (``attn +
    ssm``) and of local names bound to them; empty for anything else."""
    if isinstance(value, ast.List | ast.Tuple | ast.Set):
        return [e for e in value.elts if not isinstance(e, ast.Starred)]
    if isinstance(value, ast.ListComp | ast.SetComp | ast.GeneratorExp):
        return [value.elt]
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add) and depth < 4:
        return [*sequence_items(value.left, fn, depth + 1), *sequence_items(value.right, fn, depth + 1)]
    if isinstance(value, ast.Name) and depth < 4:
        return [e for b in fn.local_assigns.get(value.id, [])[:4] for e in sequence_items(b, fn, depth + 1)]
    return []


def local_growth(name: str, fn: FunctionInfo) -> Iterator[ast.expr]:
    """What `fn` adds to its local list `name` in bulk: ``name.extend(x)``, ``name += x``."""
    for c in fn.calls:
        f = c.func
        if isinstance(f, ast.Attribute) and f.attr == "extend" and isinstance(f.value, ast.Name) and c.args:
            yield from [c.args[0]] if f.value.id == name else []
    for a in fn.assigns:
        if isinstance(a, ast.AugAssign) and isinstance(a.target, ast.Name) and a.target.id == name:
            yield a.value


def fresh_list(value: ast.expr) -> bool:
    """A new list (``[]``, a comprehension, ``list()``), not a view or wrapper of an earlier one."""
    return isinstance(value, ast.List | ast.ListComp) or (
        isinstance(value, ast.Call) and dotted(value.func) == "list" and not value.args
    )


def bulk_growth(fn: FunctionInfo) -> Iterator[tuple[str, ast.expr]]:
    """(attribute, receiver) of each bulk addition `fn` makes from something other than a literal or comprehension
    (``self.heads.extend(more)``, ``.update(more)``, ``self.blocks += extra``); a literal's items are item stores."""
    for call in fn.calls:
        f = call.func
        added = call.args[0] if call.args else None
        if (
            isinstance(f, ast.Attribute)
            and f.attr in ("extend", "update")
            and isinstance(f.value, ast.Attribute)
            and not isinstance(added, ast.List | ast.Tuple | ast.ListComp | ast.GeneratorExp | ast.Dict)
        ):
            yield f.value.attr, f.value.value
    literal = ast.List | ast.Tuple | ast.ListComp | ast.GeneratorExp
    for a in fn.assigns:
        if not isinstance(a, ast.AugAssign) or not isinstance(a.op, ast.Add | ast.BitOr):
            continue
        if isinstance(a.target, ast.Attribute) and not isinstance(a.value, literal):
            yield a.target.attr, a.target.value


def narrowed_class(value: ast.expr) -> ast.expr | None:
    """The class a comprehension keeps its items to by an ``isinstance`` filter on the item itself (``next(b for b
    in backends if isinstance(b, PagedBackend))``, ``[m for m in mods if isinstance(m, Attn)]``): the class
    expression, when it is one class."""
    if not isinstance(value, ast.ListComp | ast.SetComp | ast.GeneratorExp) or not isinstance(value.elt, ast.Name):
        return None
    for gen in value.generators:
        for test in gen.ifs:
            if (
                isinstance(test, ast.Call)
                and dotted(test.func) == "isinstance"
                and len(test.args) == 2
                and isinstance(test.args[0], ast.Name)
                and test.args[0].id == value.elt.id
                and not isinstance(test.args[1], ast.Tuple)
            ):
                return test.args[1]
    return None


def grown(project: InstanceTyping, container: ast.expr, fn: FunctionInfo, depth: int = 1) -> bool:
    """Whether some function adds items to the attribute `container` in bulk from something other than a literal
    (``self.heads.extend(more)``, ``.update(more)``, ``+= more``) on an object of its class, a base or a subclass,
    or binds an attribute of that name on another object (``runner.heads = ...``): then its literals and appends
    do not show all its items."""
    if not isinstance(container, ast.Attribute):
        return False
    if project.attr_stores.get(container.attr):
        return True  # runner.heads = nn.ModuleDict(...) elsewhere: another object may fill it
    memo = project._grown_memo
    if memo is None:  # by the class of self where it grows its own attribute (other receivers are not typed)
        memo = {}
        for f in project.functions:
            for attr, receiver in bulk_growth(f):
                own = owner_of(f)
                if isinstance(receiver, ast.Name) and receiver.id == "self" and own.cls is not None:
                    memo.setdefault(attr, []).append(own.cls)
        project._grown_memo = memo
    owners = memo.get(container.attr)
    cls = project.instance_type(container.value, fn, depth + 1) if owners else None
    return cls is not None and any(cls in with_bases(o) or o in with_bases(cls) for o in owners or ())


def unstable_names(f: FunctionInfo) -> set[str]:
    """Names of `f` whose value is not just what they were bound to: parameters, loop variables, and lists stored
    into, added to (``+=``) or changed by a method (``bufs.append(x)``)."""
    grown = {a.target.id for a in f.assigns if isinstance(a, ast.AugAssign) and isinstance(a.target, ast.Name)}
    changed = {
        c.func.value.id
        for c in f.calls
        if isinstance(c.func, ast.Attribute) and isinstance(c.func.value, ast.Name) and c.func.attr in _MUTATORS
    }
    return {*f.params, *f.loop_vars, *f.item_stores, *grown, *changed}


_MUTATORS = frozenset({"append", "extend", "insert", "pop", "remove", "clear", "reverse", "sort", "__setitem__"})
