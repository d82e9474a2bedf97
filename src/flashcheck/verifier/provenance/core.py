"""Device provenance: does an expression hold host data, device data, or do we not know?

Flow-insensitive and interprocedural (`ValueFlow`): a value is device data when any expression it may hold is
(parameters filled by callers, ``self.x`` and other objects' attributes and dataclass fields, items of lists and
dicts, loop variables, return values of project functions); ``None`` placeholders and recursive definitions add
nothing. Where the flow knows nothing, names speak (``*_cpu``, ``*_host``, ``*_np``, pinned buffers are host;
``*_gpu``, ``*_cuda``, ``*_device`` are device). Factories follow their ``device=`` argument or an enclosing
``with torch.device(...)`` (a factory without either allocates on the CPU), ``.cpu()``/``.numpy()``/``.tolist()``
give host data, numpy calls give host arrays, and elementwise math keeps its operands' provenance.
"""

from __future__ import annotations

import ast
import fnmatch
from collections.abc import Callable

from flashcheck.verifier.astutil import dotted, kwarg, name_tokens, name_words, terminal_name
from flashcheck.verifier.project import FunctionInfo, Project, torch_name
from flashcheck.verifier.provenance.context import in_context
from flashcheck.verifier.provenance.flow import Source, ValueFlow, with_bases
from flashcheck.verifier.provenance.places import StoredPlaces
from flashcheck.verifier.provenance.tensors import (
    HOST_ATTRS,
    HOST_BUILTINS,
    HOST_RESULT_METHODS,
    NOT_TENSOR_TORCH,
    NOT_TENSOR_WORDS,
    SEQUENCES,
    TENSOR_METHODS,
    TensorUses,
    binds_by_unpacking,
    declared_tensor,
    is_array_annotation,
    is_predicate,
    is_tensor_annotation,
    is_tensor_op,
    returns_tensor,
    scalar_annotation,
    sequence_items,
    tuple_op_input,
)
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

__all__ = ["Provenance", "Where"]


_HOST_WORDS = frozenset({"cpu", "host", "np", "numpy", "pinned", "pin", "list", "lst"})
_DEVICE_WORDS = frozenset({"gpu", "cuda", "device", "dev", "gpus"})
_SEQUENCE_OPS = frozenset({"cat", "concat", "concatenate", "stack", "hstack", "vstack", "dstack", "column_stack"})
_NUMPY_ROOTS = ("np.", "numpy.")
_MAX_DEPTH = 24  # nested name/attribute/call resolutions per question (keeps far chains bounded)


# torch modules of tensor operations: a call of one under a module alias is a torch operation (`callee_name`)
_OP_MODULES = frozenset({"torch", "torch.nn.functional", "torch.special", "torch.linalg", "torch.fft"})


class Provenance(StoredPlaces):
    """Classifies expressions inside the functions of one project (results are cached per node)."""

    def __init__(
        self,
        project: Project,
        host_names: tuple[str, ...] = (),
        *,
        names_give_device: bool = True,
        flow: ValueFlow | None = None,
    ) -> None:
        """`names_give_device=False` is the strict mode: only facts (factories, ``.cuda()``, ``.to(dev)``) say DEVICE.

        Rules that report only on DEVICE values of any type (``if x:``, ``int(x)``) use the strict mode, since a
        name like ``use_gpu_flops`` says nothing about being a tensor.
        """
        self.project = project
        self.flow = flow or ValueFlow(project)
        self.host_names = host_names
        self.names_give_device = names_give_device
        self._names: dict[tuple[int, str], Where] = {}
        self._nodes: dict[ast.expr, Where] = {}
        self._active: set[object] = set()
        self._cycle = False
        self._depth = 0
        self.uses = TensorUses()

    def of(self, expr: ast.expr, fn: FunctionInfo) -> Where:
        if isinstance(expr, _NOT_TENSORS):
            return HOST
        if isinstance(expr, ast.Name):
            if self.project.reaching.not_a_tensor(expr, fn):
                return HOST  # the else of `if isinstance(x, torch.Tensor):`
            loops = fn.loop_vars.get(expr.id)
            if loops and len(loops) > 1 and expr.id not in fn.local_assigns:
                # One name reused by several loops/comprehensions: the one on the same line is this one.
                here = [it for it in loops if it.lineno == expr.lineno]
                if here and all(self._host_iterable(it, fn) for it in here):
                    return HOST
                if here:
                    return self._cached(
                        expr,
                        fn,
                        lambda: self.merge_sources([s for it in here for s in self.flow.element_sources(it, fn)]),
                    )
                inner = self.flow.loop_item_sources(expr.id, fn, expr.lineno)  # the for loop whose body holds it
                if inner:
                    return self._cached(expr, fn, lambda: self.merge_sources(inner))
            placed = self.flow.positional_sources(expr, fn)  # assigned more than once, or a parameter re-bound
            if placed is not None and self.by_name(expr.id) is not HOST:
                return self._cached(expr, fn, lambda: self.merge_sources(placed))
            return self._name(expr.id, fn)
        if isinstance(expr, ast.Attribute):
            return self._attribute(expr, fn)
        if isinstance(expr, ast.Subscript):
            if isinstance(expr.slice, ast.Slice):
                return self.of(expr.value, fn)
            held = terminal_name(expr.value) if isinstance(expr.value, ast.Name | ast.Attribute) else None
            if held is not None and self.by_name(held) is HOST:
                return HOST  # seq_lens_cpu[i]: an element of what its name says is host data
            sub = expr  # a store under a string key (self.bufs[bs]["host"]) before every element of the container
            keyed = isinstance(sub.slice, ast.Constant) and isinstance(sub.slice.value, str)  # also a literal's item
            base = self._cached(
                expr,
                fn,
                lambda: self.merge_sources(
                    self.flow.sources(sub, fn)
                    if keyed
                    else self.flow.keyed_sources(sub, fn)
                    or self.flow.indexed_sources(sub, fn)  # meta[SEQ_LENS][DEV]: the item at that position
                    or self.flow.element_sources(sub.value, fn)
                ),
            )
            if base is UNKNOWN and isinstance(expr.slice, ast.Constant) and isinstance(expr.slice.value, str):
                return self.by_name(expr.slice.value)
            if base is UNKNOWN and self._host_array(expr.value, fn):
                return HOST  # lens_np[i] of a parameter declared np.ndarray: an element of host data
            if base is not HOST and isinstance(expr.value, ast.Name) and self._host_tensor(expr.value, fn):
                return HOST  # indptr[-1] of a helper's result that this call makes on the host
            if base is UNKNOWN and declared_tensor(expr.value, fn) and self.of(expr.value, fn) is HOST:
                return HOST  # pages[mask] of a host parameter declared a Tensor: it stays on the host
            return base
        if isinstance(expr, ast.Call):
            return self._cached(expr, fn, lambda: self._call(expr, fn))
        if isinstance(expr, ast.BinOp):
            return merge([self.of(expr.left, fn), self.of(expr.right, fn)])
        if isinstance(expr, ast.UnaryOp):
            return (
                HOST
                if isinstance(expr.op, ast.Not) and self.of(expr.operand, fn) is HOST
                else self.of(expr.operand, fn)
            )
        if isinstance(expr, ast.Compare):
            if all(isinstance(op, ast.Is | ast.IsNot | ast.In | ast.NotIn) for op in expr.ops):
                return HOST
            if any(isinstance(c, ast.Constant) and isinstance(c.value, str) for c in [expr.left, *expr.comparators]):
                return HOST  # compared with a string: not a tensor
            return merge([self.of(e, fn) for e in [expr.left, *expr.comparators]])
        if isinstance(expr, ast.BoolOp):
            return merge([self.of(v, fn) for v in expr.values])
        if isinstance(expr, ast.IfExp):
            return merge([self.of(expr.body, fn), self.of(expr.orelse, fn)])
        if isinstance(expr, ast.NamedExpr):
            return self.of(expr.value, fn)
        return UNKNOWN

    def by_name(self, name: str) -> Where:
        """What a name alone says: ``seq_lens_cpu`` is host, ``kv_indptr_gpu`` is device, ``kv_indptr`` unknown."""
        if any(fnmatch.fnmatchcase(name, p) for p in self.host_names):
            return HOST
        words = name_tokens(name)
        if words & _HOST_WORDS and (not words & _DEVICE_WORDS or _last_place_word(name) in _HOST_WORDS):
            return HOST  # (of both kinds, the last place word decides: max_host_len_dev is a device value)
        if (
            self.names_give_device
            and words & _DEVICE_WORDS
            and not words & NOT_TENSOR_WORDS
            and name not in ("device", "dev")
        ):
            return DEVICE
        return UNKNOWN

    # ------------------------------------------------------------------ names and attributes
    def merge_sources(self, sources: list[Source]) -> Where:
        """Merge of what each source holds; ``None`` placeholders and recursive references add nothing."""
        values: list[Where] = []
        outer = self._cycle
        for v, where in sources:
            if isinstance(v, ast.Constant) and v.value is None:
                continue
            self._cycle = False
            w = self.of(v, where)
            if not (self._cycle and w is UNKNOWN):
                values.append(w)
            outer = outer or self._cycle
        self._cycle = outer
        return merge(values)

    def _guarded(self, key: object, compute: Callable[[], Where]) -> Where:
        if key in self._active or self._depth > _MAX_DEPTH:
            self._cycle = True  # a cycle, or a chain too long to follow: adds nothing
            return UNKNOWN
        self._active.add(key)
        self._depth += 1
        try:
            return compute()
        finally:
            self._depth -= 1
            self._active.discard(key)

    def _cached(self, node: ast.expr, fn: FunctionInfo, compute: Callable[[], Where]) -> Where:
        found = self._nodes.get(node)
        if found is None:
            found = self._nodes[node] = self._guarded(("node", id(node), id(fn)), compute)
        return found

    def _name(self, name: str, fn: FunctionInfo) -> Where:
        key = (id(fn), name)
        if key in self._names:
            return self._names[key]
        result = self._guarded(key, lambda: self._name_uncached(name, fn))
        self._names[key] = result
        return result

    def _name_uncached(self, name: str, fn: FunctionInfo) -> Where:
        named = self.by_name(name)
        if named is HOST:
            return HOST
        if name in fn.params:
            ann = fn.params[name]
            if ann is not None:
                text = ast.unparse(ann) if not isinstance(ann, ast.Name) else ann.id
                if any(w in text for w in HOST_ANNOTATIONS) and "Tensor" not in text:
                    return HOST
        loops = fn.loop_vars.get(name)
        if loops and name not in fn.local_assigns and all(self._host_iterable(it, fn) for it in loops):
            return HOST  # for n in lens_host: an element of host data is host data
        found = self.merge_sources(self.flow.name_sources(name, fn))
        return found if found is not UNKNOWN else named

    def _host_array(self, expr: ast.expr, fn: FunctionInfo, depth: int = 0) -> bool:
        """A value declared a numpy array, whose elements are host data too (a host list or dict may hold device
        tensors, and a name the function uses as a tensor may hold a container in another branch): a parameter, a
        local or an attribute annotated ``np.ndarray``/``NDArray`` (``self.pending: Optional[np.ndarray]``; not
        one that code also stores a tensor into), or a local bound once to one (``ids = self.pending``); a local
        bound again (also by unpacking or a loop) holds what it was given."""
        if depth > 4:
            return False
        if isinstance(expr, ast.Attribute):
            for c in with_bases(self.flow.instance_type(expr.value, fn)):
                if expr.attr in c.attr_types:
                    return is_array_annotation(c.attr_types[expr.attr]) and not any(
                        self.tensorish(v, where) for v, where in self.flow.attr_sources(expr, fn, by_name=False)
                    )
            return False
        if not isinstance(expr, ast.Name):
            return False
        bound = fn.local_assigns.get(expr.id, [])
        if expr.id in fn.params:  # a parameter rebound in the function (lens = upload(lens)) holds what it was given
            return not bound and is_array_annotation(fn.params[expr.id])
        if len(bound) > 1 or expr.id in fn.loop_vars or binds_by_unpacking(expr.id, fn):
            return False
        if expr.id in fn.local_types:
            return is_array_annotation(fn.local_types[expr.id])
        return len(bound) == 1 and self._host_array(bound[0], fn, depth + 1)

    def _host_iterable(self, it: ast.expr, fn: FunctionInfo) -> bool:
        """An iterable whose elements are host data: named so (``kv_lens_arr_host``), or a host tensor."""
        if not isinstance(it, ast.Name | ast.Attribute):
            return False
        word = it.id if isinstance(it, ast.Name) else it.attr
        return self.by_name(word) is HOST or (self.tensorish(it, fn) and self.of(it, fn) is HOST)

    def _attribute(self, expr: ast.Attribute, fn: FunctionInfo) -> Where:
        if expr.attr in HOST_ATTRS or (is_predicate(expr.attr) and not self._tensor_field(expr, fn)):
            return HOST  # fb.is_embed declared a Tensor field is no predicate
        if expr.attr in ("T", "mT", "data", "real", "imag"):
            return self.of(expr.value, fn)
        if expr.attr in ("values", "indices", "counts", "mean"):
            base = expr.value
            if isinstance(base, ast.Name) and base.id not in fn.params:  # top = d.topk(k); top.values
                assigned = fn.local_assigns.get(base.id) or []
                base = assigned[0] if len(assigned) == 1 else base
            held = tuple_op_input(base, fn) if isinstance(base, ast.Call) else None
            if held is not None:
                return self.of(held, fn)  # probs.topk(k).values: on probs' device
        named = self.by_name(expr.attr)
        if named is HOST or self._declared_scalar(expr, fn):
            return HOST
        if self._host_by_sibling(expr) and self.flow.instance_type(expr.value, fn) is None:
            return HOST  # attn_inputs.prefix_lengths beside attn_inputs.prefix_lengths_device, kv_len_h by kv_len_d
        # The strict mode keeps to facts: an attribute name stored as a device tensor somewhere in the project says
        # nothing about `node.op` on an object of unknown type.
        by_name = self.names_give_device
        found = self._cached(expr, fn, lambda: self.merge_sources(self.flow.attr_sources(expr, fn, by_name=by_name)))
        return found if found is not UNKNOWN else named

    @staticmethod
    def callee_name(func: ast.expr, fn: FunctionInfo) -> str | None:
        """The callee's dotted name; a tensor factory imported from torch under another name (``from torch import
        zeros as Z``) is spelled out, and so is an operation of a torch module imported under another name
        (``F.pad`` after ``import torch.nn.functional as F``, ``T.cat`` after ``import torch as T``); other names
        imported from torch are not (``has_torch_function``, ``get_rank``
        and the like return no tensor, and torch's own sources import from each other)."""
        name = dotted(func)
        head = (name or "").split(".", 1)[0]
        if head in fn.local_assigns or head in fn.params:
            return name  # F = self.feats; F.pad(...): a local, whatever the module imports under that name
        full = torch_name(func, fn)
        if full is not None and full != name and full.rsplit(".", 1)[-1] in FACTORIES | LIKE_FACTORIES:
            return full
        if full is not None and full != name and full.rpartition(".")[0] in _OP_MODULES:
            return full  # F.pad(t) after import torch.nn.functional as F: an operation of torch's on t
        return name

    def _host_tensor(self, name: ast.Name, fn: FunctionInfo) -> bool:
        """A local bound once, to a call of a project helper whose result for this call is host data: its elements
        are host data too (the helper's elements, asked without the call, would be every caller's)."""
        bound = fn.local_assigns.get(name.id, []) if name.id not in fn.params else []
        if len(bound) != 1 or not isinstance(bound[0], ast.Call):
            return False
        helper = self.flow.project.resolve_def(bound[0].func, fn)
        if not isinstance(helper, FunctionInfo) or not helper.returns:
            return False  # (a helper returning a tuple, list or dict holds values of their own places)
        if any(isinstance(r, ast.Tuple | ast.List | ast.Dict | ast.Set) for r in helper.returns):
            return False
        return self.of(bound[0], fn) is HOST

    def tensorish(self, expr: ast.expr, fn: FunctionInfo, depth: int = 0) -> bool:
        """Whether `expr` is known to be a tensor (of unknown device): a public torch operation's result, a
        parameter or field annotated ``Tensor``, a name the function uses as a tensor, a tensor method's result, an
        item, element or slice of a tensor, or arithmetic with one; used to report unknown device-ness at lower
        confidence."""
        if depth > 6:
            return False
        if isinstance(expr, ast.Subscript):
            k = expr.slice  # batch["seq_lens"] of a TypedDict that declares it a Tensor
            if isinstance(k, ast.Constant) and isinstance(k.value, str):
                return self.flow.tensor_field(expr.value, k.value, fn) is not None
            return self.tensorish(expr.value, fn, depth + 1)
        if isinstance(expr, ast.BinOp):
            return self.tensorish(expr.left, fn, depth + 1) or self.tensorish(expr.right, fn, depth + 1)
        if isinstance(expr, ast.UnaryOp) and not isinstance(expr.op, ast.Not):
            return self.tensorish(expr.operand, fn, depth + 1)
        if isinstance(expr, ast.Compare) and not any(
            isinstance(o, ast.Is | ast.IsNot | ast.In | ast.NotIn) for o in expr.ops
        ):
            return any(self.tensorish(e, fn, depth + 1) for e in [expr.left, *expr.comparators])  # t > 0: a mask
        if isinstance(expr, ast.Call):
            if is_tensor_op(self.callee_name(expr.func, fn) or ""):
                return True
            f = expr.func
            if isinstance(f, ast.Attribute) and f.attr in TENSOR_METHODS and self.tensorish(f.value, fn, depth + 1):
                return True
            read = self.flow.getter_read(expr, fn)  # seq_lens_of(batch): an imported attrgetter's attribute
            if read is not None:
                return self.tensorish(read, fn, depth + 1)
            target = self.project.resolve_def(f, fn) if isinstance(f, ast.Name | ast.Attribute) else None
            return isinstance(target, FunctionInfo) and returns_tensor(target)  # def f(...) -> torch.Tensor
        if isinstance(expr, ast.Attribute):
            if expr.attr in ("T", "mT", "data"):
                return self.tensorish(expr.value, fn, depth + 1)
            if self.uses.used_as_tensor(expr, fn):
                return True
            owner_cls = self.flow.instance_type(expr.value, fn)
            for c in with_bases(owner_cls):  # a field or attribute declared ``torch.Tensor``
                if expr.attr in c.attr_types:
                    return is_tensor_annotation(c.attr_types[expr.attr])
            prop = self.project.method(owner_cls, expr.attr) if owner_cls is not None else None
            if prop is not None and returns_tensor(prop):  # @property def seq_lens(self) -> torch.Tensor
                return True
            return self._all_tensorish(self.flow.attr_sources(expr, fn, by_name=False), depth)
        if isinstance(expr, ast.Name):
            ann = fn.params.get(expr.id)
            if ann is not None and is_tensor_annotation(ann):  # not List[torch.Tensor]
                return True
            if self.uses.used_as_tensor(expr, fn):
                return True
            loops = fn.loop_vars.get(expr.id)
            if loops and len(loops) > 1 and expr.id not in fn.local_assigns:  # a name several loops reuse
                here = [it for it in loops if it.lineno == expr.lineno]
                if here:
                    return self._all_tensorish([s for it in here for s in self.flow.element_sources(it, fn)], depth)
                inner = self.flow.loop_item_sources(expr.id, fn, expr.lineno)
                if inner:
                    return self._all_tensorish(inner, depth)
            return self._all_tensorish(self.flow.name_sources(expr.id, fn), depth)
        return False

    def tensor_where(self, expr: ast.expr, fn: FunctionInfo, depth: int = 0) -> Where:
        """Where the tensor in `expr` lives: in arithmetic and comparisons the tensor operands decide (``lens_cpu
        <= 1 + self.k`` is on the host whatever ``self.k`` is), through items and tensor-method results."""
        if depth > 6:
            return self.of(expr, fn)
        if isinstance(expr, ast.BinOp | ast.Compare):
            operands = [expr.left, expr.right] if isinstance(expr, ast.BinOp) else [expr.left, *expr.comparators]
            tensors = [e for e in operands if self.tensorish(e, fn)]
            return merge([self.tensor_where(e, fn, depth + 1) for e in tensors or operands])
        if isinstance(expr, ast.UnaryOp):
            return self.tensor_where(expr.operand, fn, depth + 1)
        if isinstance(expr, ast.Subscript):
            return self.tensor_where(expr.value, fn, depth + 1)
        if isinstance(expr, ast.Name) and expr.id not in fn.params:
            bound = fn.local_assigns.get(expr.id)  # split = tok > starts_cpu[i]; if split: the comparison's tensor
            if bound and all(isinstance(v, ast.Compare | ast.BinOp | ast.UnaryOp) for v in bound):
                return merge([self.tensor_where(v, fn, depth + 1) for v in bound])
        f = expr.func if isinstance(expr, ast.Call) else None
        if isinstance(f, ast.Attribute) and f.attr in TENSOR_METHODS and self.tensorish(f.value, fn):
            return self.tensor_where(f.value, fn, depth + 1)
        return self.of(expr, fn)

    def _all_tensorish(self, sources: list[Source], depth: int) -> bool:
        """Every value a reference may hold (``None`` placeholders aside) is a tensor: one caller passing a tensor
        does not make a generic parameter one."""
        values = [(v, w) for v, w in sources[:8] if not (isinstance(v, ast.Constant) and v.value is None)]
        return bool(values) and all(self.tensorish(v, w, depth + 1) for v, w in values)

    def _declared_scalar(self, expr: ast.Attribute, fn: FunctionInfo) -> bool:
        """``desc.sparse_dim`` where the object's class declares the field a Python scalar (``sparse_dim: int``,
        also ``Optional[int]``): whatever its constructor was given, the field holds a host value."""
        return self._declared(expr, fn) is False

    def _tensor_field(self, expr: ast.Attribute, fn: FunctionInfo) -> bool:
        """The class declares the field a tensor, or, declaring nothing, stores only tensors in it (``self.is_valid =
        torch.zeros(n, dtype=torch.bool, device=d)``)."""
        declared = self._declared(expr, fn)
        cls = self.flow.instance_type(expr.value, fn) if declared is None else None
        stored = cls is not None and self._all_tensorish(self.flow.class_attr_sources(cls, expr.attr), 0)
        return declared is True or stored

    def _declared(self, expr: ast.Attribute, fn: FunctionInfo) -> bool | None:
        """How the object's class declares the field: True a tensor, False a Python scalar, None otherwise."""
        for c in with_bases(self.flow.instance_type(expr.value, fn)):
            ann = c.attr_types.get(expr.attr)
            if ann is not None:
                return False if scalar_annotation(ann) else (True if is_tensor_annotation(ann) else None)
        return None

    # ------------------------------------------------------------------ calls
    def _call(self, call: ast.Call, fn: FunctionInfo) -> Where:
        func = call.func
        name = self.callee_name(func, fn)
        if name is not None:
            if name.startswith(_NUMPY_ROOTS):
                return HOST
            if name in HOST_BUILTINS:
                return HOST
            if name == "getattr":  # getattr(fb, "seq_lens"): the attribute it reads, when its name is known
                return merge([self.of(a, fn) for a in self.flow.getattr_reads(call, fn)])
            if name.endswith(("Parameter", "Buffer")) and (torch_name(func, fn) or name).startswith("torch.nn."):
                data = call.args[0] if call.args else kwarg(call, "data")  # nn.Parameter(t): t, wherever it lives
                return self.of(data, fn) if data is not None else UNKNOWN
            if name.startswith("torch."):
                return self._torch_call(name[6:], call, fn)
        if isinstance(func, ast.Name | ast.Attribute) and not (name or "").startswith("torch."):
            returned = self.flow.sources(call, fn)
            if returned:
                target = self.project.resolve_def(func, fn)
                if isinstance(target, FunctionInfo) and target.returns:
                    here = merge([in_context(self, r, target, call, fn) for r in target.returns[:8]])
                    if here is not UNKNOWN:  # this call's own arguments decide (a helper of host and device callers)
                        return here
                return self.merge_sources(returned)
        if isinstance(func, ast.Attribute):
            method = func.attr
            if method in HOST_RESULT_METHODS or is_predicate(method):
                return HOST
            if method == "cuda":
                return DEVICE
            if method == "to":
                return self._to_call(call, func.value, fn)
            if method in LIKE_FACTORIES or method.startswith("new_"):
                dev = self.device_arg(call, fn)
                return dev if dev is not UNKNOWN else self.of(func.value, fn)
            if method == "type_as" and call.args:  # cpu.type_as(dev) lands where its argument lives
                other = self.of(call.args[0], fn)
                return other if other is not UNKNOWN else self.of(func.value, fn)
            return self.of(func.value, fn)
        return UNKNOWN

    def _torch_call(self, name: str, call: ast.Call, fn: FunctionInfo) -> Where:
        short = name.rsplit(".", 1)[-1]
        if short in FACTORIES or short == "from_numpy":
            dev = self.device_arg(call, fn)
            if dev is not UNKNOWN:
                return dev
            for start, end, block_dev in fn.device_blocks:  # with torch.device("cuda"): factories default there
                if start <= call.lineno <= end and kwarg(call, "device") is None:
                    return self.device_value(block_dev, fn)
            if isinstance(kwarg(call, "pin_memory"), ast.Constant):
                return HOST
            if short in ("as_tensor", "asarray") and call.args:
                return self.of(call.args[0], fn)
            return HOST if kwarg(call, "device") is None else UNKNOWN
        if short in LIKE_FACTORIES:
            dev = self.device_arg(call, fn)
            if dev is not UNKNOWN:
                return dev
            return self.of(call.args[0], fn) if call.args else UNKNOWN
        metadata = short in ("device", "Size", "dtype", "is_tensor", "numel", "equal", "allclose")
        if not name.startswith("ops."):  # torch.ops.ext.get_block_offsets(t): an extension's kernel, not metadata
            metadata = metadata or (short in NOT_TENSOR_TORCH and short != "load") or short.startswith("get_")
        if metadata or short.startswith(("is_", "_is_")):
            return HOST  # metadata and Python bools (torch.equal), not tensors
        tensors = [a for a in call.args if not isinstance(a, ast.Constant)]
        if tensors and short in _SEQUENCE_OPS and isinstance(tensors[0], ast.Name | ast.Attribute):
            items = self.flow.element_sources(tensors[0], fn)[:4]  # torch.cat(parts): the tensors appended to it
            if items:
                return merge([self.of(e, where) for e, where in items])
        if tensors and isinstance(tensors[0], SEQUENCES):
            tensors = sequence_items(tensors[0])  # torch.cat([h for _, h in results] or [empty]): the items
        return merge([self.of(a, fn) for a in tensors[:2]])

    def _to_call(self, call: ast.Call, receiver: ast.expr, fn: FunctionInfo) -> Where:
        dev = self.device_arg(call, fn)
        if dev is not UNKNOWN:
            return dev
        for a in call.args:
            if isinstance(a, ast.Constant) and isinstance(a.value, str):
                return HOST if a.value.startswith("cpu") else DEVICE
            d = dotted(a)
            if d is not None and not d.startswith("torch."):  # torch.int32 is a dtype
                return self.device_value(a, fn)
        return self.of(receiver, fn)

    def device_arg(self, call: ast.Call, fn: FunctionInfo | None = None) -> Where:
        """HOST/DEVICE from a ``device=`` (or ``pin_memory=True``) keyword, also in a spread ``**dict(device=dev)``;
        UNKNOWN when there is none."""
        pin, dev = kwarg(call, "pin_memory"), kwarg(call, "device")
        for spread in (k.value for k in call.keywords if k.arg is None and fn is not None):  # **i32
            assert fn is not None
            pin = pin or next((v for v, _ in self.flow.spread_values(spread, "pin_memory", fn)), None)
            dev = dev or next((v for v, _ in self.flow.spread_values(spread, "device", fn)), None)
        if isinstance(pin, ast.Constant) and pin.value is True:
            return HOST
        return UNKNOWN if dev is None else self.device_value(dev, fn)

    def device_value(self, dev: ast.expr, fn: FunctionInfo | None = None, depth: int = 0) -> Where:
        """What a device expression names: ``"cpu"``, ``torch.device("cuda", 0)``, ``self.device``, ``q.device``,
        and (given the function) a local bound once to one of those (``here = torch.device("cpu")``)."""
        if isinstance(dev, ast.Constant):
            if isinstance(dev.value, str):
                return HOST if dev.value.startswith("cpu") else DEVICE
            return DEVICE if isinstance(dev.value, int) else UNKNOWN
        if isinstance(dev, ast.Call) and dev.args and (dotted(dev.func) == "device" or _torch_device(dev.func, fn)):
            return self.device_value(dev.args[0], fn, depth + 1)
        if isinstance(dev, ast.Name) and fn is not None and depth < 4 and dev.id not in fn.params:
            values = fn.local_assigns.get(dev.id)
            if values is not None and len(values) == 1:
                bound = self.device_value(values[0], fn, depth + 1)
                if bound is not UNKNOWN:
                    return bound
        owner = dev.value if isinstance(dev, ast.Attribute) and dev.attr == "device" and depth < 4 else None
        if owner is not None and fn is not None and self.of(owner, fn) is HOST:
            return HOST  # ``t.device`` of a host tensor ``t`` is the host
        if isinstance(dev, ast.Attribute) and fn is not None and depth < 4:
            stored = self._stored_device(dev, fn, depth)  # self.dev = torch.device("cpu")
            if stored is not UNKNOWN:
                return stored
        name = terminal_name(dev)
        if name is None:
            return UNKNOWN
        if name_tokens(name) & {"cpu", "host"}:
            return HOST
        # Serving engines put their tensors on the accelerator: an unqualified ``device`` is the GPU.
        return DEVICE if name_tokens(name) & _DEVICE_WORDS else UNKNOWN


_NOT_TENSORS = (
    ast.Constant, ast.JoinedStr, ast.List, ast.Tuple, ast.Dict, ast.Set, ast.ListComp, ast.SetComp, ast.DictComp,
    ast.GeneratorExp, ast.Lambda,
)  # fmt: skip


def _last_place_word(name: str) -> str:
    """The last word of `name` that says host or device (``max_host_len_dev``: ``dev``)."""
    return [w for w in name_words(name) if w in _HOST_WORDS or w in _DEVICE_WORDS][-1]


def _torch_device(func: ast.expr, fn: FunctionInfo | None) -> bool:
    """``torch.device``, also under an alias of torch (``T.device`` after ``import torch as T``)."""
    if dotted(func) == "torch.device":
        return True
    return fn is not None and torch_name(func, fn) == "torch.device"
