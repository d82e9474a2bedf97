"""``operator``'s getters applied to an object, read as the expressions they stand for.

``operator.attrgetter("a.b")(x)`` is ``x.a.b``, ``operator.itemgetter(k)(x)`` is ``x[k]`` and
``operator.methodcaller("plan", *args, **kw)(w)`` is ``w.plan(*args, **kw)`` (several names or keys give a tuple).
`desugar_operator_idioms` rewrites such calls in the tree right after parsing (only in files that name a getter), so
that every later stage sees the attribute, the item or the method call: the getter written where it is applied, or
kept in a module-level name bound once (``seq_lens_of = attrgetter("seq_lens")``; ``seq_lens_of(batch)``) and not
rebound in the function that applies it. A getter imported from another module is read by the value flow instead
(`getter_read`: the attribute or item it reads; a method it calls is not followed). Getters handed on uncalled
(``map(attrgetter("x"), items)``, ``sorted(key=...)``) are left as they are, as are getters whose names or keys are
not constants.

`desugar_namespace_items` does the same for an object's namespace read as a dict: ``vars(bufs)["kv_indptr"]`` and
``bufs.__dict__["kv_indptr"]`` (loaded or stored) are ``bufs.kv_indptr``, where the key is a constant identifier.
A rewritten node keeps the node it replaced, so messages quote the code as written (`as_written`).
"""

from __future__ import annotations

import ast
import copy

from flashcheck.verifier.astutil import parameters

__all__ = ["applied", "as_written", "desugar_namespace_items", "desugar_operator_idioms", "getter_parts"]

_GETTERS = frozenset({"attrgetter", "itemgetter", "methodcaller"})


def desugar_operator_idioms(tree: ast.Module, text: str) -> None:
    """Rewrite `tree` (the module parsed from `text`) in place; a file that names no getter is not walked."""
    if not any(g in text for g in _GETTERS):
        return
    names, calls = _scan(tree)
    if not names:
        return
    held: dict[str, ast.Call] = {}
    for stmt in tree.body:  # seq_lens_of = operator.attrgetter("seq_lens"), bound once at the top level
        if (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(target := stmt.targets[0], ast.Name)
            and isinstance(stmt.value, ast.Call)
            and getter_parts(stmt.value, names) is not None
        ):
            held[target.id] = stmt.value
    inline = any(isinstance(c.func, ast.Call) and getter_parts(c.func, names) for c in calls if len(c.args) == 1)
    if not inline and not any(isinstance(c.func, ast.Name) and c.func.id in held for c in calls):
        return  # sorted(xs, key=itemgetter(1)) alone: nothing to rewrite, and the tree is not transformed
    bound = _module_bindings(tree)
    held = {k: v for k, v in held.items() if bound.get(k, 0) == 1 and k not in names}
    _Rewriter(names, held).visit(tree)


def getter_parts(
    call: ast.Call, names: dict[str, str] | None = None
) -> tuple[str, list[ast.expr], list[ast.keyword]] | None:
    """``("attr"|"item"|"method", args, keywords)`` of a getter's construction (``operator.attrgetter("a", "b")``),
    where `names` maps the local names of the operator module and of its imported getters to what they are (without
    it, by spelling: ``operator.attrgetter`` or a bare ``attrgetter``); None for any other call, and for names or keys
    that are not constants."""
    f = call.func
    names = names if names is not None else {"operator": "operator", **{g: g for g in _GETTERS}}
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and names.get(f.value.id) == "operator":
        kind = f.attr
    elif isinstance(f, ast.Name):
        kind = names.get(f.id, "")
    else:
        return None
    if kind not in _GETTERS or not call.args or any(isinstance(a, ast.Starred) for a in call.args):
        return None
    if kind == "methodcaller":
        head = call.args[0]
        if not (isinstance(head, ast.Constant) and isinstance(head.value, str) and head.value.isidentifier()):
            return None
        return "method", call.args, call.keywords
    if call.keywords or not all(isinstance(a, ast.Constant) for a in call.args):
        return None
    if kind == "attrgetter" and not all(
        isinstance(a, ast.Constant) and isinstance(a.value, str) and all(p.isidentifier() for p in a.value.split("."))
        for a in call.args
    ):
        return None
    return ("attr" if kind == "attrgetter" else "item"), call.args, []


def applied(parts: tuple[str, list[ast.expr], list[ast.keyword]], obj: ast.expr, at: ast.AST) -> ast.expr:
    """What applying the getter of `parts` (`getter_parts`) to `obj` reads or calls, located at `at`."""
    kind, args, keywords = parts

    def made(node: ast.expr) -> ast.expr:  # a node of the rewrite (copied operands keep their own places)
        ast.copy_location(node, at)
        node.end_lineno, node.end_col_offset = getattr(at, "end_lineno", None), getattr(at, "end_col_offset", None)
        return node

    def one(arg: ast.expr) -> ast.expr:
        node: ast.expr = copy.deepcopy(obj)
        if kind == "item":
            return made(ast.Subscript(node, copy.deepcopy(arg), ast.Load()))
        assert isinstance(arg, ast.Constant) and isinstance(arg.value, str)
        for part in arg.value.split("."):
            node = made(ast.Attribute(node, part, ast.Load()))
        return node

    if kind == "method":
        head = args[0]
        assert isinstance(head, ast.Constant) and isinstance(head.value, str)
        method = made(ast.Attribute(copy.deepcopy(obj), head.value, ast.Load()))
        return made(ast.Call(method, copy.deepcopy(args[1:]), copy.deepcopy(keywords)))
    return one(args[0]) if len(args) == 1 else made(ast.Tuple([one(a) for a in args], ast.Load()))


def _scan(tree: ast.Module) -> tuple[dict[str, str], list[ast.Call]]:
    """The local names of the operator module (``import operator as op``: "operator") and of getters imported from
    it (``from operator import attrgetter as ag``: "attrgetter"), and every call of the file (one walk)."""
    names: dict[str, str] = {}
    calls: list[ast.Call] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            calls.append(node)
        elif isinstance(node, ast.Import):
            names.update({a.asname or a.name: "operator" for a in node.names if a.name == "operator"})
        elif isinstance(node, ast.ImportFrom) and node.module == "operator" and not node.level:
            names.update({a.asname or a.name: a.name for a in node.names if a.name in _GETTERS})
    return names, calls


def _module_bindings(tree: ast.Module) -> dict[str, int]:
    """How many times each name is bound at the top level or declared ``global`` in a function."""
    out: dict[str, int] = {}
    for stmt in tree.body:  # a class body binds its own names, a function its locals
        for node in (
            ast.walk(stmt) if not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) else ()
        ):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                out[node.id] = out.get(node.id, 0) + 1
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            for name in node.names:
                out[name] = out.get(name, 0) + 2
    return out


def _local_names(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> set[str]:
    """The names a function binds (its parameters and every name it stores)."""
    out = {p.arg for p in parameters(fn)}
    body = fn.body if isinstance(fn.body, list) else [fn.body]
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                out.add(node.id)
    return out


class _Rewriter(ast.NodeTransformer):
    def __init__(self, names: dict[str, str], held: dict[str, ast.Call]) -> None:
        self._names = names
        self._held: list[dict[str, ast.Call]] = [held]

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> ast.AST:
        shadowed = _local_names(node)
        self._held.append({k: v for k, v in self._held[-1].items() if k not in shadowed})
        self.generic_visit(node)
        self._held.pop()
        return node

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function
    visit_Lambda = _function

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if len(node.args) != 1 or node.keywords or isinstance(node.args[0], ast.Starred):
            return node
        f = node.func
        made = self._held[-1].get(f.id) if isinstance(f, ast.Name) else f if isinstance(f, ast.Call) else None
        parts = getter_parts(made, self._names) if made is not None else None
        return _replacing(applied(parts, node.args[0], node), node) if parts is not None else node


def desugar_namespace_items(tree: ast.Module, text: str) -> None:
    """Rewrite ``vars(x)["k"]`` and ``x.__dict__["k"]`` in `tree` as ``x.k``, in the top-level statements whose lines
    spell ``vars(`` or ``__dict__[`` (innermost first, so nested ones nest). A module that binds a ``vars`` of its own
    is read as if it were the builtin."""
    if "vars(" not in text and "__dict__[" not in text:
        return
    lines = {i for i, line in enumerate(text.splitlines(), 1) if "vars(" in line or "__dict__[" in line}
    spans = [s for s in tree.body if any(s.lineno <= n <= (s.end_lineno or s.lineno) for n in lines)]
    for node in reversed([n for s in spans for n in ast.walk(s)]):  # only the statements that spell one
        for field, value in ast.iter_fields(node):
            if isinstance(value, list):
                value[:] = [_namespace_item(v) if isinstance(v, ast.Subscript) else v for v in value]
            elif isinstance(value, ast.Subscript):
                setattr(node, field, _namespace_item(value))


def _namespace_item(node: ast.Subscript) -> ast.expr:
    """``x.k`` for ``vars(x)["k"]`` or ``x.__dict__["k"]`` (a constant identifier key); else `node` itself."""
    key, base = node.slice, node.value
    if not (isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value.isidentifier()):
        return node
    obj: ast.expr | None = None
    if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "vars":
        obj = base.args[0] if len(base.args) == 1 and not base.keywords else None
    elif isinstance(base, ast.Attribute) and base.attr == "__dict__":
        obj = base.value
    if obj is None or isinstance(obj, ast.Starred):
        return node
    return _replacing(ast.copy_location(ast.Attribute(obj, key.value, node.ctx), node), node)


_WRITTEN = "_flashcheck_written"  # the attribute a rewritten node keeps the node it replaced under


def _replacing(made: ast.expr, original: ast.expr) -> ast.expr:
    setattr(made, _WRITTEN, original)
    return made


def as_written(node: ast.AST) -> str:
    """`node` as source text, with each node a rewrite made put back as it was written (``vars(bufs)["k"]``, not
    ``bufs.k``)."""
    return ast.unparse(_restored(node))


def _restored(node: ast.AST) -> ast.AST:
    """`node` with each rewritten node replaced by the one it replaced; new nodes only along the paths to them."""
    original = getattr(node, _WRITTEN, None)
    if isinstance(original, ast.AST):
        return _restored(original)
    if not any(hasattr(n, _WRITTEN) for n in ast.walk(node)):
        return node
    fields: dict[str, object] = {}
    for name, value in ast.iter_fields(node):
        if isinstance(value, list):
            fields[name] = [_restored(v) if isinstance(v, ast.AST) else v for v in value]
        else:
            fields[name] = _restored(value) if isinstance(value, ast.AST) else value
    return type(node)(**fields)
