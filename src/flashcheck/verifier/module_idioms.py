"""``torch.nn.Module``'s ways of reaching a module's buffers and submodules by name, read as the attributes they are.

Rewritten in the tree right after parsing (only in files that use them), so that every later stage sees plain
attributes:

- ``self.register_buffer("kv_indptr", torch.zeros(n, dtype=torch.int32), persistent=False)`` binds
  ``self.kv_indptr``: the statement becomes that assignment, marked `REGISTERED` so that the indexer places the
  allocation on the module's device (an engine moves its modules to the GPU with ``model.to(device)``, buffers
  included, whatever device the allocation named); any other value is read as moved there (``value.cuda()``);
- ``self._buffers["kv_indptr"]`` (also ``_modules``, ``_parameters``), ``dict(model.named_buffers())["attn.k"]``
  (also ``named_modules``, ``named_parameters``), each also through a local bound once to the mapping
  (``bufs = self.inputs._buffers``; ``bufs["seq_lens"][:bs].fill_(1)``), and ``model.get_buffer("attn.k")``,
  ``get_submodule``, ``get_parameter`` with a constant path read ``model.attn.k`` (a number in the path is an item:
  ``"layers.0"`` reads ``model.layers[0]``).

Names only known at run time (``register_buffer(name, t)`` in a loop, ``get_submodule(path)``) are left as they are.
"""

from __future__ import annotations

import ast
import copy

from flashcheck.verifier.astutil import parameters

__all__ = ["REGISTERED", "desugar_module_idioms"]

REGISTERED = "flashcheck_registered_buffer"  # set on the assignments made of register_buffer calls

_TRIGGERS = ("register_buffer", "_buffers", "_modules", "_parameters", "get_buffer", "get_submodule", "named_")
_MAPPINGS = frozenset({"_buffers", "_modules", "_parameters"})
_NAMED = frozenset({"named_buffers", "named_modules", "named_parameters"})
_GETTERS = frozenset({"get_buffer", "get_submodule", "get_parameter"})
_FACTORIES = frozenset(
    {"zeros", "ones", "empty", "full", "arange", "tensor", "as_tensor", "rand", "randn", "randint", "linspace", "eye"}
)


def desugar_module_idioms(tree: ast.Module, text: str) -> None:
    """Rewrite `tree` (the module parsed from `text`) in place; a file that names none of the idioms is not walked."""
    if any(t in text for t in _TRIGGERS):
        _Rewriter().visit(tree)


def _path(owner: ast.expr, dotted_path: str, at: ast.AST, ctx: ast.expr_context) -> ast.expr | None:
    """``owner.a.b`` (``owner.layers[0]`` for a number) of the constant path ``"a.b"``, located at `at`."""
    parts = dotted_path.split(".")
    if not dotted_path or not all(p.isidentifier() or p.isdigit() for p in parts):
        return None
    node: ast.expr = copy.deepcopy(owner)
    for i, part in enumerate(parts):
        last = ctx if i == len(parts) - 1 else ast.Load()
        node = ast.Subscript(node, ast.Constant(int(part)), last) if part.isdigit() else ast.Attribute(node, part, last)
    return ast.fix_missing_locations(ast.copy_location(node, at))


def _mapping_owner(value: ast.expr) -> ast.expr | None:
    """The module whose buffers/submodules `value` maps by name: ``X`` of ``X._buffers`` or
    ``dict(X.named_buffers())``."""
    if isinstance(value, ast.Attribute) and value.attr in _MAPPINGS:
        return value.value
    if (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id == "dict"
        and len(value.args) == 1
        and isinstance(inner := value.args[0], ast.Call)
        and isinstance(inner.func, ast.Attribute)
        and inner.func.attr in _NAMED
        and not inner.args
    ):
        return inner.func.value
    return None


def _chain(expr: ast.expr) -> bool:
    """A name or an attribute chain over one (``self.inputs``): safe to read again at another place."""
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return isinstance(expr, ast.Name)


class _Rewriter(ast.NodeTransformer):
    def __init__(self) -> None:
        self._aliases: list[dict[str, ast.expr]] = [{}]

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.AST:
        self._aliases.append(_aliases(node))
        self.generic_visit(node)
        self._aliases.pop()
        return node

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        self.generic_visit(node)
        key = node.slice
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
            return node
        owner = _mapping_owner(node.value)
        if owner is None and isinstance(node.value, ast.Name):
            owner = self._aliases[-1].get(node.value.id)
        if owner is None or not _chain(owner):
            return node
        return _path(owner, key.value, node, node.ctx) or node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        f = node.func
        if (
            isinstance(f, ast.Attribute)
            and f.attr in _GETTERS
            and len(node.args) == 1
            and not node.keywords
            and isinstance(arg := node.args[0], ast.Constant)
            and isinstance(arg.value, str)
            and _chain(f.value)
        ):
            return _path(f.value, arg.value, node, ast.Load()) or node
        return node

    def visit_Expr(self, node: ast.Expr) -> ast.AST:
        self.generic_visit(node)
        call = node.value
        if not (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "register_buffer"
            and len(call.args) >= 2
            and isinstance(name := call.args[0], ast.Constant)
            and isinstance(name.value, str)
            and name.value.isidentifier()
            and not (isinstance(call.args[1], ast.Constant) and call.args[1].value is None)
        ):
            return node
        value = call.args[1]
        factory = isinstance(value, ast.Call) and _terminal(value.func) in _FACTORIES
        if not factory:  # moved with its module: read as on the device
            value = ast.copy_location(ast.Call(ast.Attribute(value, "cuda", ast.Load()), [], []), value)
        target = ast.Attribute(copy.deepcopy(call.func.value), name.value, ast.Store())
        assign = ast.fix_missing_locations(ast.copy_location(ast.Assign([target], value), node))
        setattr(assign, REGISTERED, True)
        return assign


def _terminal(func: ast.expr) -> str | None:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _aliases(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, ast.expr]:
    """Locals of `fn` bound once, to a module's name mapping (``bufs = self.inputs._buffers``): name -> module."""
    bound: dict[str, list[ast.expr | None]] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                for n in _bound(t):
                    bound.setdefault(n, []).append(node.value if isinstance(t, ast.Name) else None)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign | ast.For | ast.AsyncFor | ast.NamedExpr):
            for n in _bound(node.target):
                bound.setdefault(n, []).append(None)
        elif isinstance(node, ast.With | ast.AsyncWith):
            for n in (b for i in node.items if i.optional_vars is not None for b in _bound(i.optional_vars)):
                bound.setdefault(n, []).append(None)
    out: dict[str, ast.expr] = {}
    for name, values in bound.items():
        if len(values) == 1 and values[0] is not None and name not in {p.arg for p in parameters(fn)}:
            owner = _mapping_owner(values[0])
            if owner is not None and _chain(owner):
                out[name] = owner
    return out


def _bound(target: ast.expr) -> list[str]:
    """The names an assignment to `target` binds (through tuple unpacking; not ``x[k] = v`` nor ``x.a = v``)."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Tuple | ast.List):
        return [n for e in target.elts for n in _bound(e)]
    return _bound(target.value) if isinstance(target, ast.Starred) else []
