"""What says a value is a tensor, whatever its device: annotations, public torch operations, tensor methods, and
how a function uses a name (a tensor-only method called on it, or passed to a torch operation or ``copy_``); and the
words and builtins that say a value is no tensor (``use_cuda_graph``, ``len(...)``).

FC101 reports host reads of values known to be tensors whose device no project code decides at low confidence;
these facts are the "known to be a tensor" part, kept apart from where a value lives (`Provenance`).
"""

from __future__ import annotations

import ast

from flashcheck.verifier.astutil import annotation, dotted, terminal_name
from flashcheck.verifier.project import FunctionInfo, torch_name

__all__ = [
    "HOST_ATTRS",
    "HOST_BUILTINS",
    "HOST_RESULT_METHODS",
    "NOT_TENSOR_TORCH",
    "NOT_TENSOR_WORDS",
    "SEQUENCES",
    "TENSOR_METHODS",
    "TUPLE_OPS",
    "TensorUses",
    "binds_by_unpacking",
    "declared_tensor",
    "is_array_annotation",
    "is_predicate",
    "is_tensor_annotation",
    "is_tensor_op",
    "returns_tensor",
    "scalar_annotation",
    "sequence_items",
    "tuple_op_input",
]

NOT_TENSOR_TORCH = frozenset(
    {
        *("device", "dtype", "Size", "is_tensor", "numel", "Stream", "Event", "CUDAGraph", "Generator", "compile"),
        *("no_grad", "enable_grad", "inference_mode", "autocast", "manual_seed", "finfo", "iinfo", "typename"),
        *("promote_types", "result_type", "broadcast_shapes", "sym_int", "sym_float", "sym_max", "sym_min"),
        *("sym_not", "load", "save", "equal", "allclose"),  # torch.equal / allclose return a Python bool
    }
)
# torch operations that return several tensors on their input's device: a named tuple (``topk(...).values``,
# ``torch.max(x, dim)``) or a list (``chunk``, ``split``), unpacked or read by field.
TUPLE_OPS = frozenset(
    {
        *("topk", "sort", "max", "min", "kthvalue", "mode", "median", "nanmedian", "cummax", "cummin", "aminmax"),
        *("unique", "unique_consecutive", "chunk", "split", "tensor_split", "unbind", "var_mean", "std_mean"),
    }
)
# Tensor methods that return a tensor (of the receiver's device): a tensor's result through them is still one.
TENSOR_METHODS = frozenset(
    {
        *("sum", "max", "min", "mean", "amax", "amin", "any", "all", "prod", "argmax", "argmin", "count_nonzero"),
        *("flatten", "view", "reshape", "squeeze", "unsqueeze", "contiguous", "clone", "cumsum", "diff", "abs"),
        *("clamp", "int", "long", "float", "double", "half", "bfloat16", "type_as", "bool", "short", "byte"),
        *("cumprod", "cummax", "logcumsumexp", "gather", "index_select", "masked_fill", "transpose", "permute", "t"),
        *("expand", "expand_as", "repeat", "flip", "roll", "narrow", "sqrt", "exp", "log", "neg", "sign", "round"),
        *("floor", "ceil", "pow", "softmax", "log_softmax", "eq", "ne", "lt", "le", "gt", "ge", "logical_not"),
    }
)


# Methods that only torch tensors have (numpy arrays, lists and modules do not; ``.cuda()``/``.half()`` are also
# nn.Module methods): calling one on a name says it is a tensor.
_TORCH_ONLY_METHODS = frozenset(
    {
        *("int", "long", "numel", "element_size", "unsqueeze", "masked_fill", "masked_fill_", "index_select"),
        *("new_zeros", "new_empty", "new_ones", "new_full", "type_as", "view_as", "expand_as", "copy_", "fill_"),
        *("zero_", "clamp_", "add_", "sub_", "mul_", "div_", "record_stream", "is_contiguous", "data_ptr", "narrow"),
        *("index_copy_", "scatter_"),
    }
)
# torch functions whose first argument is a size, a host array or a seed, not a tensor.
TORCH_FACTORIES = frozenset(
    {
        *("tensor", "as_tensor", "asarray", "from_numpy", "frombuffer", "empty", "zeros", "ones", "full", "arange"),
        *("rand", "randn", "randint", "randperm", "empty_strided", "linspace", "logspace", "eye", "range", "normal"),
        *("Tensor", "IntTensor", "LongTensor", "FloatTensor", "BoolTensor"),
    }
)


# Tensor methods and attributes whose result lives on the host (metadata, Python values, host copies).
HOST_RESULT_METHODS = frozenset(
    {
        "cpu",
        "numpy",
        "tolist",
        "item",
        "pin_memory",
        "size",
        "numel",
        "dim",
        "stride",
        "element_size",
        "data_ptr",
        "storage_offset",
        "ndimension",
        "nelement",
        "is_contiguous",
        "get_device",
        "keys",
        "items",
        "values",
        "__len__",
        "startswith",
        "endswith",
        "split",
        "join",
        "format",
        "lower",
        "upper",
        "strip",
        "replace",
    }
)

HOST_ATTRS = frozenset({"shape", "dtype", "ndim", "is_cuda", "device", "itemsize", "nbytes", "layout"})

_STR_PREDICATES = frozenset({"isdigit", "isalpha", "isalnum", "isspace", "isupper", "islower", "isidentifier"})


def tuple_op_input(call: ast.Call, fn: FunctionInfo) -> ast.expr | None:
    """The tensor whose device the items of `call` share: the receiver of ``x.topk(k)``, the first argument of
    ``torch.max(x, dim)``; None when `call` is no `TUPLE_OPS` operation (the builtin ``max`` is not)."""
    func = call.func
    if not isinstance(func, ast.Attribute) or func.attr not in TUPLE_OPS:
        return None
    if (torch_name(func, fn) or "").startswith("torch."):
        return call.args[0] if call.args else None
    return func.value


def is_predicate(name: str) -> bool:
    """A method or attribute that answers a Python bool (``t.is_contiguous()``, ``t._is_view()``, ``t.is_sparse``,
    ``s.isdigit()``), not a tensor; ``is_nonzero`` reads the tensor's value (a sync of its own, not a tensor)."""
    return (name.startswith(("is_", "_is_")) and name != "is_nonzero") or name in _STR_PREDICATES


# Names with a device word that hold flags, counts or handles, not tensors (``use_cuda_graph``, ``num_gpus``).
NOT_TENSOR_WORDS = frozenset(
    {
        "use",
        "is",
        "has",
        "enable",
        "enabled",
        "disable",
        "num",
        "count",
        "size",
        "id",
        "rank",
        "name",
        "type",
        "capability",
        "available",
        "graph",
        "graphs",
        "stream",
        "streams",
        "event",
        "events",
        "props",
        "properties",
        "index",
        "world",
        "mode",
        "backend",
        "mesh",
        "kind",
        "str",
        "module",
        "config",
        "cfg",
        "arch",
        "sm",
        "memory",
        "mem",
        "total",
    }
)

# Builtins and math functions whose result is a host value, whatever they are given.
HOST_BUILTINS = frozenset(
    {
        "len",
        "int",
        "float",
        "bool",
        "str",
        "range",
        "list",
        "tuple",
        "dict",
        "set",
        "sum",
        "max",
        "min",
        "sorted",
        "enumerate",
        "zip",
        "abs",
        "round",
        "isinstance",
        "divmod",
        "hash",
        "repr",
        "any",
        "all",
        "math.ceil",
        "math.floor",
        "math.prod",
    }
)
_SCALARS = frozenset({"bool", "int", "float", "str", "bytes"})


def scalar_annotation(ann: ast.expr) -> bool:
    """``int``, ``bool``, ``float``, ``str``, ``bytes``, also ``Optional[...]`` of one or written as a string."""
    found = annotation(ann)
    return found is not None and dotted(found) in _SCALARS


class TensorUses:
    """Names and attribute chains a function uses as tensors (cached per function)."""

    def __init__(self) -> None:
        self._uses: dict[int, frozenset[str]] = {}

    def used_as_tensor(self, expr: ast.expr, fn: FunctionInfo) -> bool:
        """`expr` (``x``, ``self.x``, ``meta.x``) has a tensor-only method called on it in `fn`, or is passed (or a
        slice of it is) to a public torch operation other than a factory, or to ``copy_``."""
        text = dotted(expr)
        return text is not None and text in self._of(fn)

    def _of(self, fn: FunctionInfo) -> frozenset[str]:
        found = self._uses.get(id(fn))
        if found is None:
            found = self._uses[id(fn)] = frozenset(self._collect(fn))
        return found

    @staticmethod
    def _collect(fn: FunctionInfo) -> set[str]:
        out: set[str] = set()
        for call in fn.calls:
            f = call.func
            if isinstance(f, ast.Attribute) and f.attr in _TORCH_ONLY_METHODS:
                d = dotted(_base(f.value))
                if d is not None:
                    out.add(d)
            name = torch_name(f, fn) or ""
            consumes = f.attr == "copy_" if isinstance(f, ast.Attribute) else False
            if call.args and (consumes or (is_tensor_op(name) and name.rsplit(".", 1)[-1] not in TORCH_FACTORIES)):
                first = call.args[0]  # the tensor operand (later arguments may be sizes, dims or scalars)
                for item in first.elts if isinstance(first, ast.List | ast.Tuple) else [first]:
                    d = dotted(_base(item))
                    if d is not None:
                        out.add(d)
        return out


def _base(expr: ast.expr) -> ast.expr:
    """``x`` for ``x[:n]`` (a slice of a tensor is one, and says the base is one)."""
    while isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Slice | ast.Tuple):
        expr = expr.value
    return expr


def is_tensor_annotation(ann: ast.expr) -> bool:
    """``torch.Tensor``, ``Tensor``, ``Optional[torch.Tensor]``, ``torch.Tensor | None`` (not a list of tensors)."""
    found = annotation(ann)
    return terminal_name(found) == "Tensor" if isinstance(found, ast.Name | ast.Attribute) else False


# Namespaces whose public functions are tensor operations (``torch.cat``, ``torch.nn.functional.pad``); torch's
# other modules (``torch.cuda``, ``torch._C``, ``torch._guards``...) mostly return flags, handles and contexts.
_TENSOR_OP_NAMESPACES = frozenset({"torch", "torch.nn.functional", "torch.linalg", "torch.special", "torch.fft"})
_NOT_TENSOR_PREFIXES = ("_", "is_", "get_", "set_", "use_", "are_", "has_", "can_")


def is_tensor_op(name: str) -> bool:
    """``torch.cat``, ``torch.nn.functional.pad``: a public tensor operation by its dotted name."""
    namespace, _, last = name.rpartition(".")
    return (
        namespace in _TENSOR_OP_NAMESPACES
        and bool(last)
        and not last.startswith(_NOT_TENSOR_PREFIXES)
        and last not in NOT_TENSOR_TORCH
    )


SEQUENCES = (ast.List, ast.Tuple, ast.ListComp, ast.GeneratorExp, ast.BoolOp, ast.IfExp)


def sequence_items(seq: ast.expr) -> list[ast.expr]:
    """The tensors a sequence argument (``torch.cat(seq)``) holds: a literal's items, a comprehension's element, and
    those of each alternative of ``parts or [empty]`` / ``a if c else b``; `seq` itself for anything else."""
    if isinstance(seq, ast.List | ast.Tuple):
        return [e for e in seq.elts if not isinstance(e, ast.Starred)]
    if isinstance(seq, ast.ListComp | ast.GeneratorExp):
        return [seq.elt]
    if isinstance(seq, ast.BoolOp):
        return [e for v in seq.values for e in sequence_items(v)]
    if isinstance(seq, ast.IfExp):
        return sequence_items(seq.body) + sequence_items(seq.orelse)
    return [seq]


def is_array_annotation(ann: ast.expr | None) -> bool:
    """``np.ndarray``, ``NDArray[np.int32]``, ``Optional[np.ndarray]``; not one that also names a tensor."""
    text = "" if ann is None else ast.unparse(ann)
    return ("ndarray" in text or "NDArray" in text) and "Tensor" not in text


def binds_by_unpacking(name: str, fn: FunctionInfo) -> bool:
    """Whether `fn` binds `name` by unpacking (``ids, count = fetch()``)."""
    return any(
        isinstance(t, ast.Tuple | ast.List) and any(isinstance(e, ast.Name) and e.id == name for e in ast.walk(t))
        for a in fn.assigns
        if isinstance(a, ast.Assign)
        for t in a.targets
    )


def declared_tensor(expr: ast.expr, fn: FunctionInfo) -> bool:
    """A parameter annotated ``torch.Tensor`` (also ``Optional[...]``)."""
    ann = annotation(fn.params.get(expr.id)) if isinstance(expr, ast.Name) else None
    return ann is not None and terminal_name(ann) == "Tensor"


def returns_tensor(fn: FunctionInfo) -> bool:
    """A function annotated to return a ``torch.Tensor``."""
    node = fn.node
    return not isinstance(node, ast.Module) and node.returns is not None and is_tensor_annotation(node.returns)
