"""The project's Triton kernels: where a function launches one (``kernel[grid](...)`` of a ``@triton.jit`` function)
and which of its pointer parameters it stores through (``tl.store``/``tl.atomic_*``), so that a launch that hands a
graph-bound buffer to such a parameter writes that buffer (FC104)."""

from __future__ import annotations

import ast

from flashcheck.verifier.astutil import dotted
from flashcheck.verifier.project import FunctionInfo, Project

__all__ = ["kernel_writes", "triton_launches"]

_TRITON_STORES = frozenset(
    {"store", "atomic_add", "atomic_max", "atomic_min", "atomic_xchg", "atomic_cas", "atomic_and", "atomic_or"}
)


def triton_launches(fn: FunctionInfo, project: Project) -> list[tuple[FunctionInfo, ast.Call]]:
    """Triton kernel launches in `fn` (``kernel[grid](...)``) of ``@triton.jit`` functions of the project."""
    out: list[tuple[FunctionInfo, ast.Call]] = []
    for call in fn.calls:
        f = call.func
        if isinstance(f, ast.Subscript) and isinstance(f.value, ast.Name | ast.Attribute):
            kernel = project.resolve_def(f.value, fn)
            if isinstance(kernel, FunctionInfo) and _is_triton_kernel(kernel):
                out.append((kernel, call))
    return out


def _is_triton_kernel(fn: FunctionInfo) -> bool:
    for d in fn.decorators:
        name = dotted(d.func if isinstance(d, ast.Call) else d) or ""
        if name in ("triton.jit", "jit") or name.endswith(".jit"):
            return True
    return False


def kernel_writes(kernel: FunctionInfo) -> set[str]:
    """Parameters a Triton kernel stores through: the pointer operands of ``tl.store``/``tl.atomic_*``
    (``tl.store(out_ptr + offs, v)`` writes what ``out_ptr`` points to)."""
    out: set[str] = set()
    for call in kernel.calls:
        f = call.func
        if isinstance(f, ast.Attribute) and f.attr in _TRITON_STORES and call.args:
            stack, seen = [call.args[0]], 0
            while stack and seen < 32:
                e = stack.pop()
                seen += 1
                if isinstance(e, ast.Name):
                    if e.id in kernel.params:
                        out.add(e.id)
                    else:
                        stack.extend(kernel.local_assigns.get(e.id, [])[:2])
                elif isinstance(e, ast.BinOp):
                    stack.extend([e.left, e.right])
                elif isinstance(e, ast.Subscript | ast.Attribute):
                    stack.append(e.value)
    return out
