"""``torch.autograd.Function`` subclasses: ``Fn.apply(q, k)`` runs ``Fn.forward(ctx, q, k)``.

Engines wrap attention and metadata steps in Functions (to trace or checkpoint a model); the call graph follows
``.apply`` into the static ``forward``, whose first parameter is the context object torch makes, so the arguments
fill the parameters after it. A Function that defines ``setup_context`` takes no context in ``forward``.
"""

from __future__ import annotations

import ast

from flashcheck.verifier.astutil import dotted, is_abstract
from flashcheck.verifier.index import ClassInfo, FunctionInfo, with_bases

__all__ = ["applies_forward", "ctx_shift", "is_autograd_function"]

_FUNCTION_BASES = frozenset({"torch.autograd.Function", "torch.autograd.function.Function"})


def is_autograd_function(cls: ClassInfo) -> bool:
    """Whether `cls` (or a project base of it) derives from ``torch.autograd.Function`` as its module imports it."""
    for c in with_bases(cls):
        imports = c.module.imports
        for b in c.node.bases:
            name = dotted(b) or ""
            head, _, rest = name.partition(".")
            full = imports.get(head, head) + (f".{rest}" if rest else "")
            if full in _FUNCTION_BASES:
                return True
    return False


def applies_forward(call: ast.Call, callee: FunctionInfo) -> bool:
    """Whether `call` is ``Fn.apply(...)`` reaching `callee`, the ``forward`` of a Function."""
    f = call.func
    static = not isinstance(callee.node, ast.Module) and any(
        dotted(d) == "staticmethod" for d in callee.node.decorator_list
    )  # torch's Functions take a static forward; another kind binds its first parameter itself
    return (
        isinstance(f, ast.Attribute)
        and f.attr == "apply"
        and callee.name == "forward"
        and static
        and callee.cls is not None
        and is_autograd_function(callee.cls)
    )


def ctx_shift(call: ast.Call, callee: FunctionInfo) -> int:
    """How many leading parameters of `callee` no argument of `call` fills: 1 for the context of a Function's
    ``forward`` called through ``apply`` (none where the class defines ``setup_context``), else 0."""
    if not applies_forward(call, callee):
        return 0
    assert callee.cls is not None
    own = (c.methods.get("setup_context") for c in with_bases(callee.cls))  # not a base's declaration (torch's own)
    return 0 if any(m is not None and not is_abstract(m.node) for m in own) else 1
