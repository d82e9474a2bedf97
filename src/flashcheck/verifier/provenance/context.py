"""Where a project function's result lives for one call: its parameters are that call's arguments.

``get_seq_lens(indptr_host, last_host, page)`` is on the host even if other callers pass device tensors, also when
the helper computes through locals, tensor methods and factories placed on a parameter's device
(``offsets = torch.arange(n, device=seq_lens.device)``; ``out = (seq_lens.to(torch.int32) + offsets).squeeze(1)``).
Parts that do not come from parameters keep their context-free answer (`Provenance.of`).
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from flashcheck.verifier.astutil import kwarg, terminal_name
from flashcheck.verifier.index import FunctionInfo
from flashcheck.verifier.provenance.flow import arg_for_param
from flashcheck.verifier.provenance.tensors import SEQUENCES, TENSOR_METHODS, is_tensor_op, sequence_items
from flashcheck.verifier.provenance.where import (
    DEVICE,
    FACTORIES,
    HOST,
    HOST_ANNOTATIONS,
    LIKE_FACTORIES,
    UNKNOWN,
    Where,
    merge,
)

if TYPE_CHECKING:
    from flashcheck.verifier.provenance.core import Provenance

__all__ = ["in_context"]

_MAX_DEPTH = 12
_MAX_NODES = 48  # expressions looked at per question (a helper's locals may branch)


def in_context(prov: Provenance, expr: ast.expr, callee: FunctionInfo, call: ast.Call, caller: FunctionInfo) -> Where:
    """Where the expression `expr` of `callee` (a return expression, or an operand) lives for `call` (made in
    `caller`)."""
    return _Context(prov, callee, call, caller).where(expr, 0)


class _Context:
    def __init__(
        self,
        prov: Provenance,
        callee: FunctionInfo,
        call: ast.Call,
        caller: FunctionInfo,
        outer: _Context | None = None,
    ) -> None:
        self.prov, self.callee, self.call, self.caller = prov, callee, call, caller
        self.outer = outer  # the context `call` is made in: its arguments are answered there
        self.visiting: set[str] = set()  # locals under evaluation: a recursive definition adds nothing
        self.locals: dict[str, Where] = {}  # locals answered (a helper reads them more than once)
        self.nodes = 0

    def where(self, expr: ast.expr, depth: int) -> Where:
        self.nodes += 1
        if depth > _MAX_DEPTH or self.nodes > _MAX_NODES:
            return UNKNOWN
        callee = self.callee
        if isinstance(expr, ast.Constant):
            return HOST
        if isinstance(expr, ast.Name):
            bound = callee.local_assigns.get(expr.id)
            rebound = (
                expr.id in callee.loop_vars or expr.id in self.prov.flow.unpacked(callee) or _augmented(callee, expr.id)
            )
            if _filled(callee, expr.id):
                return UNKNOWN  # parts.append(dev): a list filled as it goes is not answered here
            if expr.id in callee.params and expr.id not in callee.local_assigns:
                held = [self._param(expr.id)]
                if rebound:  # lens, _ = torch.sort(table); for lens in parts: also what those bind
                    held += [self.where(v, depth + 1) for v, _ in self.prov.flow.unpacked(callee).get(expr.id, [])]
                    items = self.prov.flow.loop_item_sources(expr.id, callee) if expr.id in callee.loop_vars else None
                    held += [self.prov.merge_sources(items)] if items else []  # for lens in parts: their items
                    held += [self.where(a.value, depth + 1) for a in _augmented_values(callee, expr.id)]
                return merge(held)
            if expr.id not in callee.params and bound and len(bound) <= 3 and not rebound:
                if expr.id in self.visiting:
                    return HOST  # x = f(x): the other definitions decide
                if expr.id not in self.locals:
                    self.visiting.add(expr.id)
                    self.locals[expr.id] = merge([self.where(v, depth + 1) for v in bound])
                    self.visiting.discard(expr.id)
                return self.locals[expr.id]
        if isinstance(expr, ast.BinOp):
            return merge([self.where(e, depth + 1) for e in (expr.left, expr.right)])
        if isinstance(expr, ast.UnaryOp):
            return self.where(expr.operand, depth + 1)
        if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Slice):
            return self.where(expr.value, depth + 1)
        if isinstance(expr, ast.Call):
            found = self._call(expr, depth)
            if found is not None:
                return found
        return self.prov.of(expr, callee)

    def _param(self, name: str) -> Where:
        arg = arg_for_param(self.call, self.callee, name)
        if arg is None:
            passed = UNKNOWN
        elif isinstance(arg, ast.Name) and _filled(self.caller, arg.id):
            passed = UNKNOWN  # a list the caller fills by appends: what it holds is not answered here
        elif any(_placing(n) for n in ast.walk(arg)):
            passed = UNKNOWN  # cpu.type_as(dev), x.to(torch.cuda.current_device()): placed by another value
        elif self.outer is not None:
            passed = self.outer.where(arg, 0)
        else:
            passed = self.prov.of(arg, self.caller)
        ann = self.callee.params.get(name)
        text = "" if ann is None else ast.unparse(ann)
        if passed is UNKNOWN and text and any(w in text for w in HOST_ANNOTATIONS) and "Tensor" not in text:
            return HOST  # dcp_size: int, unless the call passes a device tensor for it (seq_lens.max())
        return passed

    def _call(self, expr: ast.Call, depth: int) -> Where | None:
        func = expr.func
        name = self.prov.callee_name(func, self.callee) or ""
        short = name.rsplit(".", 1)[-1]
        if name.startswith("torch.") and short in FACTORIES | LIKE_FACTORIES:
            dev = kwarg(expr, "device")  # torch.arange(n, device=seq_lens.device): where seq_lens is
            if isinstance(dev, ast.Attribute) and dev.attr == "device":
                return self.where(dev.value, depth + 1)
            if isinstance(dev, ast.Name) and dev.id in self.callee.params and dev.id not in self.callee.local_assigns:
                arg = arg_for_param(self.call, self.callee, dev.id)  # device=device, the caller passing "cpu"
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    return HOST if arg.value.startswith("cpu") else DEVICE
                if arg is not None and not isinstance(arg, ast.Constant):  # torch.device("cpu"), self.cpu_device
                    placed = self.prov.device_value(arg, self.caller)
                    return placed if placed is not UNKNOWN else None
            return None
        if is_tensor_op(name) and expr.args:
            first = expr.args[0]  # torch.cat([a, b]): the listed tensors
            operands = sequence_items(first) if isinstance(first, SEQUENCES) else expr.args[:2]
            return merge([self.where(a, depth + 1) for a in operands[:4]])
        if isinstance(func, ast.Attribute) and func.attr.startswith("new_") and func.attr != "new_tensor":
            # counts.new_zeros(1): where counts is, unless a device is named
            return None if kwarg(expr, "device") is not None else self.where(func.value, depth + 1)
        if isinstance(func, ast.Attribute) and func.attr in ("type_as", "new_tensor", "cuda"):  # placed by another
            return self.where(expr.args[0], depth + 1) if func.attr == "type_as" and expr.args else None
        if isinstance(func, ast.Attribute) and (func.attr in TENSOR_METHODS or func.attr == "to"):
            if func.attr == "to" and (kwarg(expr, "device") is not None or _names_a_device(expr)):
                return None  # .to(device): the device it names
            return self.where(func.value, depth + 1)  # x.squeeze(1), x.to(torch.int32): where x is
        named = isinstance(func, ast.Name | ast.Attribute)
        target = self.prov.project.resolve_def(func, self.callee) if named else None
        short_returns = isinstance(target, FunctionInfo) and 0 < len(target.returns) <= 4
        if isinstance(target, FunctionInfo) and short_returns and self.outer is None and depth < _MAX_DEPTH // 2:
            nested = _Context(self.prov, target, expr, self.callee, outer=self)  # prepare_lens(cu_seqlens) here
            nested.nodes = self.nodes
            found = merge([nested.where(r, depth + 1) for r in target.returns[:4]])
            self.nodes = nested.nodes
            return found
        if target is None and _library_function(func, self.callee) and (expr.args or expr.keywords):
            args = [*expr.args, *(k.value for k in expr.keywords)]  # triton.cdiv(lens, chunk): of host values, host
            strings = any(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in args)  # "cuda"
            if not strings and len(args) <= 4 and all(self.where(a, depth + 1) is HOST for a in args):
                return HOST
        return None


def _augmented(fn: FunctionInfo, name: str) -> bool:
    """`name` is also rebound by an augmented assignment (``out += dev``), which `local_assigns` does not hold."""
    return bool(_augmented_values(fn, name))


def _augmented_values(fn: FunctionInfo, name: str) -> list[ast.AugAssign]:
    return [
        a for a in fn.assigns if isinstance(a, ast.AugAssign) and isinstance(a.target, ast.Name) and a.target.id == name
    ]


def _names_a_device(call: ast.Call) -> bool:
    """``.to(...)`` given a positional argument that is not a dtype (``torch.int32``, ``x.dtype``); a call
    (``torch.cuda.current_device()``, ``torch.device(...)``) names a device."""
    for a in call.args:
        text = ast.unparse(a)
        dtype = text.startswith("torch.") and not text.startswith(("torch.device", "torch.cuda")) and "(" not in text
        if not dtype and not text.endswith("dtype"):
            return True
    return False


def _filled(fn: FunctionInfo, name: str) -> bool:
    """Whether `fn` adds items to its local or parameter `name` (``parts.append(dev)``, ``parts.extend(...)``,
    ``parts[i] = dev``); not stores into a tensor the function allocates (``out[1:] = torch.cumsum(...)`` leaves
    ``out`` where ``torch.zeros(..., device=x.device)`` put it)."""
    stored = name in fn.item_stores and not _allocated(fn, name)
    return stored or any(
        isinstance(c.func, ast.Attribute)
        and c.func.attr in ("append", "extend", "insert")
        and isinstance(c.func.value, ast.Name)
        and c.func.value.id == name
        for c in fn.calls
    )


def _allocated(fn: FunctionInfo, name: str) -> bool:
    """Whether every value `fn` binds to its local `name` is an array allocation (``torch.zeros(...)``,
    ``x.new_zeros(...)``, ``torch.empty_like(x)``, ``np.zeros(n)``): storing into it does not move it."""
    values = fn.local_assigns.get(name) if name not in fn.params else None
    return bool(values) and all(
        isinstance(v, ast.Call)
        and ((made := terminal_name(v.func) or "") in FACTORIES | LIKE_FACTORIES or made.startswith("new_"))
        for v in values or ()
    )


def _library_function(func: ast.expr, fn: FunctionInfo) -> bool:
    """A function of another library, not torch's, called by its module (``triton.cdiv``, ``math.ceil``) or imported
    by name from one (``from triton import cdiv``): not a method of an object, a callable parameter or an alias."""
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        module = fn.module.imports.get(func.value.id, "")
        return bool(module) and func.value.id not in fn.params and not module.startswith("torch")
    if isinstance(func, ast.Name) and func.id not in fn.params and func.id not in fn.local_assigns:
        target = fn.module.imports.get(func.id, "")
        return bool(target) and not target.startswith("torch")
    return False


def _placing(node: ast.AST) -> bool:
    """A call that puts a tensor where another value says: ``x.type_as(y)``, ``.to(<device>)``, ``.cuda()``."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return False
    attr = node.func.attr
    return attr in ("type_as", "cuda") or (
        attr == "to" and (kwarg(node, "device") is not None or _names_a_device(node))
    )
