"""Where a function's syntax makes Python read values on the host: text formatting (``f"{t}"``, ``str(t)``,
``"%d" % t``), membership tests (``tok in t``) and comprehension conditions, each found without walking functions
whose text cannot hold them. FC101 judges the values these give (`flashcheck.verifier.rules.fc101_host_sync`)."""

from __future__ import annotations

import ast
import re

from flashcheck.verifier.index import FunctionInfo

__all__ = ["comprehension_ifs", "formatted_values", "membership_tests"]

_FORMATTERS = frozenset({"str", "repr", "print", "format"})
# prefixes of f-strings (``rf"`` contains ``f"``), the % operator and the formatting builtins
_FORMAT_MARKS = (
    *(p + q for p in ("f", "F", "fr", "fR", "Fr", "FR") for q in ('"', "'")),
    *("%", "str(", "repr(", "print(", "format("),
)


def function_text(fn: FunctionInfo) -> str:
    """The source lines of `fn` (all of them for a module's top-level code): what a text test looks at before a
    walk. Comments and strings are in it: a test may only skip a walk when a word is absent."""
    node = fn.node
    if isinstance(node, ast.Module):
        return "\n".join(fn.source.lines)
    return "\n".join(fn.source.lines[node.lineno - 1 : node.end_lineno or node.lineno])


_IN, _IF = re.compile(r"\bin\b"), re.compile(r"(?m) if |^\s*if ")


def membership_tests(fn: FunctionInfo) -> list[ast.Compare]:
    """The ``in``/``not in`` comparisons of conditions, assigned values and returns."""
    if not _IN.search(function_text(fn)):
        return []  # no `in` anywhere in the text: no membership test to walk for
    roots = [*fn.tests, *(a.value for a in fn.assigns if a.value is not None), *fn.returns]
    return [
        n
        for r in roots
        for n in ast.walk(r)
        if isinstance(n, ast.Compare) and any(isinstance(op, ast.In | ast.NotIn) for op in n.ops)
    ]


def formatted_values(fn: FunctionInfo) -> list[tuple[ast.expr, ast.AST]]:
    """Values formatted as text on the path that runs: ``f"{t}"``, ``str(t)``, ``repr(t)``, ``print(t)``,
    ``format(t)`` (not in ``raise`` statements or assert messages, which run only when something already failed,
    and not lazy ``logger.debug("%s", t)`` arguments)."""
    out: list[tuple[ast.expr, ast.AST]] = []
    node = fn.node
    text = function_text(fn)
    if isinstance(node, ast.Module) or not any(mark in text for mark in _FORMAT_MARKS):
        return out  # nothing that formats: skip the walk (most functions)
    stack: list[ast.AST] = list(node.body)
    while stack:
        n = stack.pop()
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda | ast.Raise):
            continue
        if isinstance(n, ast.Assert):
            stack.append(n.test)
            continue
        if isinstance(n, ast.FormattedValue):
            out.append((n.value, n.value))
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in _FORMATTERS:
            out.extend((a, n) for a in n.args if not isinstance(a, ast.Constant | ast.JoinedStr))
        elif isinstance(n, ast.BinOp) and _is_percent_format(n):  # "%d tokens" % t, "%s/%s" % (a, b)
            right = n.right
            out.extend((a, n) for a in (right.elts if isinstance(right, ast.Tuple) else [right]))
        stack.extend(ast.iter_child_nodes(n))
    return out


def comprehension_ifs(fn: FunctionInfo) -> list[ast.expr]:
    """Conditions of the function's comprehensions (``[i for i in ids if t[i] > 0]``): a branch per element."""
    node = fn.node
    text = function_text(fn)
    if isinstance(node, ast.Module) or not (" for " in text and _IF.search(text)):
        return []  # no comprehension with a condition can be here (it may span lines): skip the walk
    out: list[ast.expr] = []
    stack: list[ast.AST] = list(node.body)
    while stack:
        n = stack.pop()
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        if isinstance(n, ast.comprehension):
            out.extend(n.ifs)
        stack.extend(ast.iter_child_nodes(n))
    return out


def _is_percent_format(node: ast.BinOp) -> bool:
    return isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant) and isinstance(node.left.value, str)
