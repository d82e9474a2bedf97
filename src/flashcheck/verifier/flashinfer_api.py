"""What the static rules know about FlashInfer's Python API, in one place (names only; nothing is imported).

Facts come from FlashInfer's wrappers (``decode.py``, ``prefill.py``, ``mla.py``): their constructor parameters,
the private attributes engines reach into, and the entry points whose workspace must start zeroed
("Must be initialized to 0 for its first use").
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

from flashcheck.verifier.astutil import alias_value, dotted, kwarg, name_tokens, terminal_name
from flashcheck.verifier.project import FunctionInfo, Project, imported_name

__all__ = [
    "GENERIC_PRIVATE",
    "PLAN_METHODS",
    "RUN_METHODS",
    "SPECIFIC_PRIVATE",
    "WRAPPER_BUFFERS",
    "WRAPPER_PRIVATE",
    "ZEROED_WORKSPACE_BACKENDS",
    "ZEROED_WORKSPACE_CONSUMERS",
    "flashinfer_call_sites",
    "graph_mode",
    "imports_flashinfer",
    "is_flashinfer_import",
    "is_wrapper_class_name",
    "looks_like_wrapper",
    "needs_zeroed_workspace",
    "workspace_arg",
    "wrapper_buffer_args",
    "wrapper_buffer_for",
    "wrapper_class_of_call",
]

# Private buffers of graph-mode wrappers: the storage their captured kernels read.
WRAPPER_BUFFERS = frozenset(
    {
        "_paged_kv_indptr_buf",
        "_paged_kv_indices_buf",
        "_paged_kv_last_page_len_buf",
        "_qo_indptr_buf",
        "_kv_indptr_buf",
        "_kv_indices_buf",
        "_kv_lens_buffer",
        "_custom_mask_buf",
        "_mask_indptr_buf",
        "_block_tables",
    }
)
# Private attributes whose names only FlashInfer uses: any access from outside FlashInfer is a finding.
SPECIFIC_PRIVATE = WRAPPER_BUFFERS | frozenset(
    {
        "_plan_info",
        "_cached_module",
        "_int_workspace_buffer",
        "_float_workspace_buffer",
        "_pin_memory_int_workspace_buffer",
        "_use_cuda_graph",
        "_fixed_batch_size",
        "_max_total_num_rows",
        "_vector_sparse_indptr_buffer",
        "_vector_sparse_indices_buffer",
        "_jit_module",
        "_use_tensor_cores",
        "_batch_size_with_padding",
        "_max_kv_len",
        "_kv_lens",
        "_qo_indptr",
        "_kv_indptr",
    }
)
# Private attributes with common names: reported only on a receiver that is a FlashInfer wrapper.
GENERIC_PRIVATE = frozenset(
    {
        "_backend",
        "_kv_layout",
        "_sm_scale",
        "_window_left",
        "_logits_soft_cap",
        "_rope_scale",
        "_rope_theta",
        "_pos_encoding_mode",
        "_num_qo_heads",
        "_num_kv_heads",
        "_causal",
        "_workspace_size",
    }
)
# Every private attribute FlashInfer's wrapper classes set (its attention wrappers' sources, 2026-08): on a receiver
# that is a wrapper each is FlashInfer's state, as the common names above are.
_WRAPPER_PRIVATE_NAMES = """
    _attention_sinks _backend _batch_decode_wrapper _batch_prefill_wrapper _batch_prefill_wrappers _batch_size
    _block_tables _cached_kv_data_type _cached_module _cached_o_data_type _cached_q_data_type _causal _compiled
    _compiled_main _compiled_reducer _cu_seqlens_q _custom_mask_buf _cute_dsl_fmha_plan _cute_dsl_use_fmha
    _cute_dsl_wrapper _dense_page_idx_kv _device _device_index _fixed_batch_size _float_workspace_buffer
    _float_workspace_buffer_d _float_workspace_buffer_p _fmha_v2_batch_size _fmha_v2_kv_indptr _fmha_v2_max_kv_len
    _fmha_v2_max_q_len _fmha_v2_qo_indptr _fmha_v2_seq_lens _geometry _gqa_group_size _head_dim _head_dim_ckv
    _indptr_type _int_workspace_buffer _int_workspace_buffer_d _int_workspace_buffer_p _jit_additional_scalar_names
    _jit_additional_tensor_names _jit_module _kv_data_type _kv_dtype _kv_indices_buf _kv_indices_buf_d
    _kv_indices_buf_p _kv_indptr _kv_indptr_buf _kv_indptr_buf_d _kv_indptr_buf_p _kv_last_page_len_buf_d
    _kv_last_page_len_buf_p _kv_layout _kv_len_arr_buf _kv_lengths_mode _kv_lens_buffer _kv_lora_rank
    _kv_prefix_mode _logical_kv_indptr _logits_soft_cap _lse _mask_indptr_buf _mask_mode _mask_type
    _max_item_len_ptr _max_kv_len _max_q_len _max_qo_len _max_seq_len_q _max_sequence_kv _max_token_per_sequence
    _max_total_num_rows _num_heads _num_kv_heads _num_levels _num_qo_heads _o_dtype _o_indptr_buf _output_dtype
    _output_scale _packed_mask_buf _packed_query _page_size _paged_kv_indices _paged_kv_indices_buf _paged_kv_indptr
    _paged_kv_indptr_buf _paged_kv_last_page_len _paged_kv_last_page_len_buf _partial_o _partial_stats
    _pin_memory_int_workspace_buffer _pin_memory_int_workspace_buffer_d _pin_memory_int_workspace_buffer_p
    _plan_info _plan_info_d _plan_info_p _plan_state _planned _planned_total_q _planned_total_q_tokens _policy
    _pos_encoding_mode _prefix_len_ptr _q_data_type _q_dtype _q_len_per_req _qk_rope_head_dim _qo_indptr
    _qo_indptr_buf _qo_indptr_buf_d _qo_indptr_buf_p _qo_indptr_last _rope_scale _rope_theta _scale_softmax_log2
    _seq_len_q _seq_lens _seq_lens_kv _seq_lens_q _sm_aware_sched _sm_scale _split_kv _split_kv_counter
    _token_pos_in_items_len _token_pos_in_items_ptr _trtllm_gen_multi_ctas_kv_counter_buffer _use_cuda_graph
    _use_fp16_qk_reduction _use_packed_q _use_profiler _use_tensor_cores _v_indptr_buf _vsa_q2k_index _vsa_q2k_num
    _window_left _window_right _workspace _workspace_buffer _workspace_layout _workspace_size _workspace_views
"""
WRAPPER_PRIVATE = frozenset(_WRAPPER_PRIVATE_NAMES.split())
PLAN_METHODS = frozenset({"plan", "begin_forward", "fast_decode_plan", "fast_mla_decode_plan"})
RUN_METHODS = frozenset({"run", "forward", "run_return_lse", "forward_return_lse"})
ZEROED_WORKSPACE_CONSUMERS = frozenset(
    {
        "trtllm_batch_decode_with_kv_cache",
        "trtllm_batch_decode_with_kv_cache_mla",
        "trtllm_batch_context_with_kv_cache",
        "xqa_batch_decode_with_kv_cache",
        "xqa_batch_decode_with_kv_cache_mla",
    }
)
# Wrappers whose workspace must start zeroed only with these backends (trtllm-gen kernels keep counters there).
ZEROED_WORKSPACE_BACKENDS = frozenset({"trtllm-gen", "trtllm", "trtllm-gen-mla", "xqa"})
_WORKSPACE_KWARGS = ("workspace_buffer", "float_workspace_buffer", "workspace")
# Buffers a graph-mode BatchMLAPagedAttentionWrapper keeps by reference (its constructor's keyword names).
_MLA_BUFFERS = frozenset({"qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr"})
# Constructor parameters by position (FlashInfer's signatures), for buffers passed positionally.
_POSITIONAL: dict[str, tuple[str, ...]] = {
    "BatchDecodeWithPagedKVCacheWrapper": (
        "float_workspace_buffer",
        "kv_layout",
        "use_cuda_graph",
        "use_tensor_cores",
        "paged_kv_indptr_buffer",
        "paged_kv_indices_buffer",
        "paged_kv_last_page_len_buffer",
    ),
    "CUDAGraphBatchDecodeWithPagedKVCacheWrapper": (
        "workspace_buffer",
        "indptr_buffer",
        "indices_buffer",
        "last_page_len_buffer",
    ),
    "BatchPrefillWithPagedKVCacheWrapper": (
        "float_workspace_buffer",
        "kv_layout",
        "use_cuda_graph",
        "qo_indptr_buf",
        "paged_kv_indptr_buf",
        "paged_kv_indices_buf",
        "paged_kv_last_page_len_buf",
        "custom_mask_buf",
        "mask_indptr_buf",
    ),
    "BatchPrefillWithRaggedKVCacheWrapper": (
        "float_workspace_buffer",
        "kv_layout",
        "use_cuda_graph",
        "qo_indptr_buf",
        "kv_indptr_buf",
        "custom_mask_buf",
        "mask_indptr_buf",
    ),
    "BatchMLAPagedAttentionWrapper": (
        "float_workspace_buffer",
        "use_cuda_graph",
        "qo_indptr",
        "kv_indptr",
        "kv_indices",
        "kv_len_arr",
    ),
}


def is_flashinfer_target(target: str) -> bool:
    """Whether an import target (``flashinfer.decode.fast_decode_plan``) is the ``flashinfer`` package or in it."""
    return target == "flashinfer" or target.startswith("flashinfer.")


def module_imports_flashinfer(imports: Iterable[str]) -> bool:
    """Whether any of a module's import targets is from ``flashinfer``."""
    return any(is_flashinfer_target(t) for t in imports)


def is_flashinfer_import(fn: FunctionInfo, name: str) -> bool:
    """Whether local `name` (a dotted prefix) was imported from the ``flashinfer`` package."""
    return is_flashinfer_target(fn.module.imports.get(name.split(".", maxsplit=1)[0], ""))


def imported_elsewhere(func: ast.expr, fn: FunctionInfo, project: Project) -> bool:
    """A callable imported from a package outside FlashInfer and the project (``compute_ops.persistent_topk``, a
    local bound once to ``getattr(compute_ops, "topk")``, an op of a module global bound to an extension's
    namespace: ``flash_mla_cuda = torch.ops._flashmla_C``); not a method of a local object, a builtin, or anything
    a module of the project provides (its own code, or what it re-exports)."""
    root = func
    if isinstance(func, ast.Name) and func.id not in fn.module.imports:
        values = fn.local_assigns.get(func.id, [])
        if len(values) != 1:
            return False
        v = values[0]
        root = v.args[0] if isinstance(v, ast.Call) and dotted(v.func) == "getattr" and v.args else v
    root = _chain_root(root)
    if isinstance(root, ast.Name) and root.id not in fn.module.imports:
        held = fn.module.global_values(root.id)  # flash_mla_cuda = torch.ops._flashmla_C
        root = _chain_root(held[0][0]) if len(held) == 1 else root
    target = fn.module.imports.get(root.id) if isinstance(root, ast.Name) else None
    if target is None or project.resolve_def(func, fn) is not None:
        return False
    return _foreign_target(target, project, 0)


def _chain_root(expr: ast.expr, *, calls: bool = False) -> ast.expr:
    """What an attribute chain (with `calls`, also calls: ``torch.ops.load("x").y``) starts from (``torch`` for
    ``torch.ops._flashmla_C``)."""
    while isinstance(expr, ast.Attribute) or (calls and isinstance(expr, ast.Call)):
        expr = expr.value if isinstance(expr, ast.Attribute) else expr.func
    return expr


def _foreign_target(target: str, project: Project, depth: int) -> bool:
    """An import target outside FlashInfer and the project's own code; through a module of the project, what
    that module imports or binds under the name (a re-export of FlashInfer's is FlashInfer's, an extension loaded
    there is another package's)."""
    if is_flashinfer_target(target) or depth > 4:
        return False
    parts = target.split(".")
    for i in range(len(parts) - 1, 0, -1):
        mod = project.modules.get(".".join(parts[:i]))
        if mod is None:
            continue
        name = parts[i]
        if name in mod.functions or name in mod.classes or i < len(parts) - 1:
            return False  # the project's own code (also a submodule of its package that is not checked)
        if name in mod.imports:
            return _foreign_target(mod.imports[name], project, depth + 1)
        held = mod.global_values(name)  # rtp_llm_ops = torch.ops.rtp_llm, or an alias of an import
        if not held:  # from a star import (``from librtp_compute_ops import *``), unless the module has none
            stars = [t for k, t in mod.imports.items() if k.startswith("*")]
            return bool(stars) and not any(is_flashinfer_target(t) for t in stars)
        root = _chain_root(held[0][0], calls=True) if len(held) == 1 else None
        origin = mod.imports.get(root.id) if isinstance(root, ast.Name) else None
        return origin is not None and _foreign_target(origin, project, depth + 1)
    return project.modules.get(target) is None


def imports_flashinfer(fn: FunctionInfo, expr: ast.expr) -> bool:
    """Whether a Name/Attribute chain starts with a name imported from ``flashinfer`` (`is_flashinfer_import` of
    its dotted name, without building it)."""
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return isinstance(expr, ast.Name) and is_flashinfer_target(fn.module.imports.get(expr.id, ""))


def flashinfer_call_sites(project: Project, subclasses: Iterable[str] = ()) -> set[int]:
    """``id()`` of every function where `wrapper_class_of_call` or `imports_flashinfer` can hold for a call: those
    that call a name ending in ``Wrapper`` or one of `subclasses` (project classes deriving from a wrapper), and
    every function of a module that imports from ``flashinfer`` or imports a project module's alias of one of its
    classes. A rule that scans every call for either may skip
    the other functions."""
    extra = set(subclasses)
    by_name = project.calls_by_name().items()
    out = {
        id(fn)
        for name, sites in by_name
        if name.endswith("Wrapper") or name in extra or name in UNSUFFIXED_WRAPPERS
        for fn, _ in sites
    }
    for mod in project.modules.values():
        if mod.class_aliases or module_imports_flashinfer(mod.imports.values()):
            out.update(id(fn) for fn in project.by_module.get(mod.name, []))
    return out


# FlashInfer classes that plan and run attention like the wrappers but are not named ``*Wrapper`` (the persistent
# holistic kernel's ``flashinfer.BatchAttention``): recognised only as imported from flashinfer.
UNSUFFIXED_WRAPPERS = frozenset({"BatchAttention"})


def is_wrapper_class_name(name: str) -> bool:
    return name in UNSUFFIXED_WRAPPERS or (
        name.endswith("Wrapper")
        and (name.startswith(("Batch", "CUDAGraph", "Single", "Multi", "POD")) or "Attention" in name)
    )


def wrapper_class_of_call(call: ast.Call, fn: FunctionInfo) -> str | None:
    """The FlashInfer wrapper class a call constructs (``BatchDecodeWithPagedKVCacheWrapper``), if any, also under
    another name (``from flashinfer import BatchDecodeWithPagedKVCacheWrapper as Decode``)."""
    func: ast.expr = call.func
    # Every call of the project passes here: a name that neither ends in ``Wrapper`` nor is imported from
    # flashinfer nor a module's alias of a class (the only ways a renamed class gets here) is none, before any
    # string is built.
    if isinstance(func, ast.Name) and not is_flashinfer_import(fn, func.id):
        alias = _class_alias(func, fn)  # Decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper
        if alias is None and not func.id.endswith("Wrapper"):
            return None
        func = alias if alias is not None else func
    if isinstance(func, ast.Attribute):
        if not (func.attr.endswith("Wrapper") or func.attr in UNSUFFIXED_WRAPPERS):
            return None
    elif not isinstance(func, ast.Name) or not (func.id.endswith("Wrapper") or is_flashinfer_import(fn, func.id)):
        return None
    name = dotted(func)
    if name is None:
        return None
    full = imported_name(func, fn, "flashinfer") or name
    if full.startswith("flashinfer.") and is_wrapper_class_name(full.rsplit(".", 1)[-1]):
        return full.rsplit(".", 1)[-1]
    last = name.rsplit(".", 1)[-1]
    if (
        is_wrapper_class_name(last)
        and last not in UNSUFFIXED_WRAPPERS
        and (is_flashinfer_import(fn, name) or name.startswith("flashinfer.") or last not in fn.module.classes)
    ):
        return last
    return None


def _class_alias(func: ast.Name, fn: FunctionInfo) -> ast.expr | None:
    """What a module global named like a class is bound to, once (a ``None`` fallback aside), as a name or attribute
    chain (``Decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper``, `alias_value`), also one imported from the
    project module that binds it; None for anything else."""
    if not func.id[:1].isupper() or func.id in fn.module.classes or func.id in fn.local_assigns:
        return None
    linked = fn.module.class_aliases.get(func.id)  # from .api import Decode (bound there): found at linking
    if linked is not None:
        return linked
    return alias_value([v for v, _ in fn.module.global_values(func.id)])


def graph_mode(call: ast.Call, cls_name: str, *, positions: bool = True) -> bool | None:
    """True/False when the constructor call says whether the wrapper is in CUDA-graph mode; None if unknown.
    Without `positions` (a project subclass with its own ``__init__``) only a ``use_cuda_graph=`` keyword says."""
    if cls_name.startswith("CUDAGraph"):
        return True
    v = kwarg(call, "use_cuda_graph")
    at = 1 if "MLA" in cls_name else 2  # MLA: (float_workspace_buffer, use_cuda_graph, ...)
    if v is None and positions and len(call.args) > at and cls_name.startswith("Batch"):
        v = call.args[at]
    if v is None:  # not given, so False; unknown where a **kwargs dict may hold it
        return False if positions and all(kw.arg is not None for kw in call.keywords) else None
    if isinstance(v, ast.Constant) and isinstance(v.value, bool):
        return v.value
    return None


def wrapper_buffer_args(call: ast.Call, cls_name: str) -> list[tuple[str, ast.expr]]:
    """Persistent buffers handed to a wrapper constructor: ``(parameter name, expression)`` (a positional argument
    is named by the constructor's signature where it is known, else ``positional argument <i>``)."""
    names = _POSITIONAL.get(cls_name, ())
    out = [
        (kw.arg, kw.value)
        for kw in call.keywords
        if kw.arg and _is_buffer_param(kw.arg, cls_name) and not isinstance(kw.value, ast.Constant)
    ]
    for kw in call.keywords:  # a cascade's per-level lists: paged_kv_indices_buf_arr=[doc_indices, unique_indices]
        if kw.arg and kw.arg.endswith("_buf_arr"):
            out.extend((f"{kw.arg}[{i}]", e) for i, e in enumerate(_level_buffers(kw.value)))
    first = 1 if cls_name.startswith("CUDAGraph") else 2 if "MLA" in cls_name else 3
    for i, a in enumerate(call.args[first:], start=first):
        if isinstance(a, ast.Constant) or (i < len(names) and not _is_buffer_param(names[i], cls_name)):
            continue  # a layout or flag known by its position (use_tensor_cores)
        out.append((names[i] if i < len(names) else f"positional argument {i}", a))
    return out


def _level_buffers(value: ast.expr) -> list[ast.expr]:
    """The buffers of a cascade wrapper's ``*_buf_arr`` argument: a list's items; the list a comprehension walks
    (``[b[: bs + 1] for b in self.kv_indptr_bufs]`` binds every buffer of ``self.kv_indptr_bufs``) or indexes by
    its loop variable (``[self.kv_indices_bufs[i] for i in range(2)]``); a list passed whole (``self.bufs``)."""
    if isinstance(value, ast.List | ast.Tuple):
        return [e for e in value.elts if not isinstance(e, ast.Starred | ast.Constant)]
    if isinstance(value, ast.Name | ast.Attribute):
        return [value]
    if isinstance(value, ast.ListComp) and len(value.generators) == 1:
        loop = value.generators[0]
        elt = value.elt
        if isinstance(elt, ast.Subscript) and isinstance(elt.slice, ast.Slice):
            elt = elt.value
        if not isinstance(loop.target, ast.Name):
            return []
        if isinstance(elt, ast.Name) and elt.id == loop.target.id:
            return [loop.iter]
        if isinstance(elt, ast.Subscript) and isinstance(elt.slice, ast.Name) and elt.slice.id == loop.target.id:
            return [elt.value]
    return []


def _is_buffer_param(name: str, cls_name: str) -> bool:
    return (name.endswith(("_buf", "_buffer")) or ("MLA" in cls_name and name in _MLA_BUFFERS)) and (
        "workspace" not in name
    )


def wrapper_buffer_for(call: ast.Call, cls_name: str, private: str) -> ast.expr | None:
    """The constructor argument a wrapper keeps as private buffer `private` (``_paged_kv_indices_buf`` is what
    ``paged_kv_indices_buffer=``, ``paged_kv_indices_buf=`` or a ``CUDAGraph*Wrapper``'s ``indices_buffer`` was);
    None when the call does not pass it."""
    want = _buffer_stem(private)
    for param, expr in wrapper_buffer_args(call, cls_name):
        stem = _buffer_stem(param)
        if want == stem or want.endswith("_" + stem):
            return expr
    return None


def _buffer_stem(name: str) -> str:
    stem = name.lstrip("_")
    for suffix in ("_buffer", "_buf"):
        stem = stem.removesuffix(suffix)
    return stem


def workspace_arg(call: ast.Call, fn: FunctionInfo | None = None) -> ast.expr | None:
    """The workspace a FlashInfer call or constructor receives (keyword, or the name of a positional argument); with
    `fn`, a kernel function imported under another name (``trtllm_batch_context_with_kv_cache as trt_context``) is
    known by its own name."""
    for k in _WORKSPACE_KWARGS:
        v = kwarg(call, k)
        if v is not None:
            return v
    for a in call.args:
        n = terminal_name(a)
        if n is not None and name_tokens(n) & {"workspace", "ws"}:
            return a
    callee = terminal_name(call.func) or ""
    if fn is not None and isinstance(call.func, ast.Name) and call.func.id in fn.module.imports:
        callee = (imported_name(call.func, fn, "flashinfer") or callee).rsplit(".", 1)[-1]
    if fn is not None and isinstance(call.func, ast.Name) and not is_wrapper_class_name(callee):
        callee = wrapper_class_of_call(call, fn) or callee  # Decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper
    if is_wrapper_class_name(callee) and call.args:
        return call.args[0]
    if callee.startswith(("trtllm_", "xqa_")) and len(call.args) > 2:  # (query, kv_cache, workspace_buffer, ...)
        return call.args[2]
    return None


def needs_zeroed_workspace(
    call: ast.Call, extra: frozenset[str] = frozenset(), fn: FunctionInfo | None = None
) -> str | None:
    """The consumer name when `call` hands its workspace to a kernel that needs it zeroed: the trtllm-gen / XQA /
    MLA trtllm functions, or a wrapper constructed with one of those backends (``backend="trtllm-gen"``); with `fn`,
    also under an import alias (``from flashinfer import BatchDecodeWithPagedKVCacheWrapper as DecodeW``)."""
    name = terminal_name(call.func)
    if name is None:
        return None
    renamed = fn is not None and isinstance(call.func, ast.Name) and name in fn.module.imports  # `... as DecodeW`
    if renamed and fn is not None and name not in ZEROED_WORKSPACE_CONSUMERS and name not in extra:
        imported = imported_name(call.func, fn, "flashinfer")
        name = wrapper_class_of_call(call, fn) or (imported.rsplit(".", 1)[-1] if imported else name)
    if name in ZEROED_WORKSPACE_CONSUMERS or name in extra:
        return name
    if not is_wrapper_class_name(name) and fn is not None:  # Decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper
        name = wrapper_class_of_call(call, fn) or name
    if not is_wrapper_class_name(name):
        return None
    backend = kwarg(call, "backend")
    if (
        isinstance(backend, ast.Constant)
        and isinstance(backend.value, str)
        and backend.value in ZEROED_WORKSPACE_BACKENDS
    ):
        return f'{name}(backend="{backend.value}")'
    return None


def looks_like_wrapper(expr: ast.expr) -> bool:
    """A receiver named like a wrapper: ``wrapper``, ``self.decode_wrappers[i]``, ``prefill_wrapper_paged``."""
    n = terminal_name(expr)
    return n is not None and bool(name_tokens(n) & {"wrapper", "wrappers"})
