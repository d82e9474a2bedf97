"""What the static rules know about FlashInfer's Python API, in one place (names only; nothing is imported).

Facts come from FlashInfer's wrappers (``decode.py``, ``prefill.py``, ``mla.py``): their constructor parameters,
the private attributes engines reach into, and the entry points whose workspace must start zeroed
("Must be initialized to 0 for its first use").
"""

from __future__ import annotations

import ast

from flashcheck.verifier.astutil import dotted, kwarg, name_tokens, terminal_name
from flashcheck.verifier.project import FunctionInfo

__all__ = [
    "GENERIC_PRIVATE",
    "PLAN_METHODS",
    "RUN_METHODS",
    "SPECIFIC_PRIVATE",
    "ZEROED_WORKSPACE_CONSUMERS",
    "graph_mode",
    "is_flashinfer_import",
    "is_wrapper_class_name",
    "looks_like_wrapper",
    "workspace_arg",
    "wrapper_buffer_args",
    "wrapper_class_of_call",
]

# Private attributes whose names only FlashInfer uses: any access from outside FlashInfer is a finding.
SPECIFIC_PRIVATE = frozenset(
    {
        "_plan_info",
        "_cached_module",
        "_int_workspace_buffer",
        "_float_workspace_buffer",
        "_pin_memory_int_workspace_buffer",
        "_paged_kv_indptr_buf",
        "_paged_kv_indices_buf",
        "_paged_kv_last_page_len_buf",
        "_qo_indptr_buf",
        "_kv_indptr_buf",
        "_kv_indices_buf",
        "_kv_lens_buffer",
        "_custom_mask_buf",
        "_mask_indptr_buf",
        "_use_cuda_graph",
        "_fixed_batch_size",
        "_max_total_num_rows",
        "_vector_sparse_indptr_buffer",
        "_vector_sparse_indices_buffer",
        "_block_tables",
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
PLAN_METHODS = frozenset({"plan", "begin_forward", "fast_decode_plan", "fast_mla_decode_plan"})
RUN_METHODS = frozenset({"run", "forward", "run_return_lse", "forward_return_lse"})
ZEROED_WORKSPACE_CONSUMERS = frozenset(
    {
        "BatchDecodeWithPagedKVCacheWrapper",
        "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
        "trtllm_batch_decode_with_kv_cache",
        "trtllm_batch_decode_with_kv_cache_mla",
        "trtllm_batch_context_with_kv_cache",
        "xqa_batch_decode_with_kv_cache",
        "xqa_batch_decode_with_kv_cache_mla",
    }
)
_WORKSPACE_KWARGS = ("workspace_buffer", "float_workspace_buffer", "workspace")


def is_flashinfer_import(fn: FunctionInfo, name: str) -> bool:
    """Whether local `name` (a dotted prefix) was imported from the ``flashinfer`` package."""
    head = name.split(".", maxsplit=1)[0]
    target = fn.module.imports.get(head, "")
    return target == "flashinfer" or target.startswith("flashinfer.")


def is_wrapper_class_name(name: str) -> bool:
    return name.endswith("Wrapper") and (
        name.startswith(("Batch", "CUDAGraph", "Single", "Multi", "POD")) or "Attention" in name
    )


def wrapper_class_of_call(call: ast.Call, fn: FunctionInfo) -> str | None:
    """The FlashInfer wrapper class a call constructs (``BatchDecodeWithPagedKVCacheWrapper``), if any."""
    name = dotted(call.func)
    if name is None:
        return None
    last = name.rsplit(".", 1)[-1]
    if is_wrapper_class_name(last) and (
        is_flashinfer_import(fn, name) or name.startswith("flashinfer.") or last not in fn.module.classes
    ):
        return last
    return None


def graph_mode(call: ast.Call, cls_name: str) -> bool | None:
    """True/False when the constructor call says whether the wrapper is in CUDA-graph mode; None if unknown."""
    if cls_name.startswith("CUDAGraph"):
        return True
    v = kwarg(call, "use_cuda_graph")
    if v is None and len(call.args) > 2 and cls_name.startswith("Batch"):
        v = call.args[2]
    if v is None:
        return False
    if isinstance(v, ast.Constant) and isinstance(v.value, bool):
        return v.value
    return None


def wrapper_buffer_args(call: ast.Call, cls_name: str) -> list[tuple[str, ast.expr]]:
    """Persistent buffers handed to a wrapper constructor: ``(parameter name, expression)``."""
    out = [
        (kw.arg, kw.value)
        for kw in call.keywords
        if kw.arg
        and kw.arg.endswith(("_buf", "_buffer"))
        and "workspace" not in kw.arg
        and not isinstance(kw.value, ast.Constant)
    ]
    first = 1 if cls_name.startswith("CUDAGraph") else 3
    for i, a in enumerate(call.args[first:], start=first):
        if not isinstance(a, ast.Constant):
            out.append((f"positional argument {i}", a))
    return out


def workspace_arg(call: ast.Call) -> ast.expr | None:
    """The workspace a FlashInfer call or constructor receives (keyword, or the name of a positional argument)."""
    for k in _WORKSPACE_KWARGS:
        v = kwarg(call, k)
        if v is not None:
            return v
    for a in call.args:
        n = terminal_name(a)
        if n is not None and "workspace" in name_tokens(n):
            return a
    return call.args[0] if call.args and terminal_name(call.func) in _WRAPPERS_WITH_WS_FIRST else None


_WRAPPERS_WITH_WS_FIRST = frozenset(n for n in ZEROED_WORKSPACE_CONSUMERS if n.endswith("Wrapper"))


def looks_like_wrapper(expr: ast.expr) -> bool:
    """A receiver named like a wrapper: ``wrapper``, ``self.decode_wrappers[i]``, ``prefill_wrapper_paged``."""
    n = terminal_name(expr)
    return n is not None and bool(name_tokens(n) & {"wrapper", "wrappers"})
