"""Where storage comes from: the persistent buffer an expression views, and the allocation that made it.

Both follow slices, views, local aliases, ``self.<attr>`` assignments anywhere in the class (and its bases) and
module globals; nothing crosses into other objects' attributes.
"""

from __future__ import annotations

import ast

from flashcheck.verifier.astutil import dotted, storage_root
from flashcheck.verifier.project import ClassInfo, FunctionInfo

__all__ = ["ALLOCATORS", "Key", "allocations", "owner", "storage_keys", "with_bases"]

Key = tuple[str, str, str]
ALLOCATORS = frozenset(
    {
        "empty",
        "zeros",
        "ones",
        "full",
        "empty_like",
        "zeros_like",
        "ones_like",
        "full_like",
        "empty_strided",
        "arange",
        "tensor",
        "as_tensor",
        "rand",
        "randn",
        "randint",
    }
)


def owner(fn: FunctionInfo) -> FunctionInfo:
    """The outermost function of a closure (whose ``self`` a nested function sees)."""
    while fn.parent is not None:
        fn = fn.parent
    return fn


def with_bases(cls: ClassInfo) -> list[ClassInfo]:
    out: list[ClassInfo] = []
    stack = [cls]
    while stack and len(out) < 32:
        c = stack.pop()
        if c not in out:
            out.append(c)
            stack.extend(c.bases)
    return out


def storage_keys(expr: ast.expr, fn: FunctionInfo, depth: int = 0) -> list[Key]:
    """Keys of the persistent storage an expression views: ``self.x`` (one per class in the MRO) or a global."""
    root = storage_root(expr)
    if isinstance(root, ast.Name) and depth < 4:
        values = fn.local_assigns.get(root.id)
        if values and root.id not in fn.params:
            keys = [k for v in values for k in storage_keys(v, fn, depth + 1)]
            return keys if len(values) == 1 else []
        mod_body = fn.module.body
        if mod_body is not None and root.id in mod_body.local_assigns and root.id not in fn.params:
            return [("global", fn.module.name, root.id)]
        return []
    base = root
    while isinstance(base, ast.Attribute | ast.Subscript):
        base = base.value
    if isinstance(base, ast.Name) and base.id == "self":
        cls = owner(fn).cls
        if cls is None:
            return []
        text = ast.unparse(root)
        return [("self", c.qualname, text) for c in with_bases(cls)]
    return []


def allocations(expr: ast.expr, fn: FunctionInfo, depth: int = 0) -> list[tuple[ast.Call, FunctionInfo]]:
    """The ``torch.<factory>(...)`` calls whose storage `expr` may be (through aliases, views, self attributes)."""
    if depth > 4:
        return []
    root = storage_root(expr)
    if isinstance(root, ast.Call):
        name = dotted(root.func) or ""
        if name.startswith("torch.") and name.rsplit(".", 1)[-1] in ALLOCATORS:
            return [(root, fn)]
        if isinstance(root.func, ast.Attribute) and root.func.attr.startswith("new_"):
            return [(root, fn)]
        return []
    if isinstance(root, ast.Name):
        values = fn.local_assigns.get(root.id)
        if values is None and fn.module.body is not None and fn is not fn.module.body:
            values = fn.module.body.local_assigns.get(root.id)
            fn = fn.module.body
        return [a for v in values or [] for a in allocations(v, fn, depth + 1)]
    if isinstance(root, ast.Attribute) and isinstance(root.value, ast.Name) and root.value.id == "self":
        cls = owner(fn).cls
        out: list[tuple[ast.Call, FunctionInfo]] = []
        for c in with_bases(cls) if cls is not None else []:
            for v, where in c.attr_assigns.get(root.attr, []):
                out.extend(allocations(v, where, depth + 1))
        return out
    return []
