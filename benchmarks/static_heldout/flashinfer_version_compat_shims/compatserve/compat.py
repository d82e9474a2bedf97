"""FlashInfer version compatibility layer.

compatserve runs on two FlashInfer release lines at once:

* **0.1.6** (the wheel some of our production images still pin): wrappers spell their
  methods ``begin_forward``/``forward``, the CUDA-graph decode wrapper is its own class
  (``CUDAGraphBatchDecodeWithPagedKVCacheWrapper``) taking its buffers positionally, there
  is no ``fast_decode_plan``, no trtllm-gen backend and no fused top-k/top-p sampler.
* **>= 0.2** (0.2.5 through 0.4.x): ``plan``/``run``, ``use_cuda_graph=True`` on the regular
  wrapper, JIT modules, and, depending on the exact release, ``fast_decode_plan``,
  ``fixed_split_size``/``disable_split_kv`` plan knobs and ``trtllm_batch_decode_with_kv_cache``.

The major API is chosen by version; individual features are probed with ``hasattr`` and
``inspect.signature`` so that point releases need no code change. Everything else in the
engine imports FlashInfer names from here.
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import logging
import os
from typing import Any, Callable, Dict, FrozenSet, Mapping, Optional

import flashinfer
import flashinfer.decode
import torch
from packaging.version import Version

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------
# Version detection
# ---------------------------------------------------------------------------------------


def _detect_version() -> Version:
    for dist in ("flashinfer-python", "flashinfer"):
        try:
            return Version(importlib.metadata.version(dist))
        except importlib.metadata.PackageNotFoundError:
            continue
    return Version(getattr(flashinfer, "__version__", "0.1.6"))


FLASHINFER_VERSION: Version = _detect_version()
PLAN_RUN_API: bool = FLASHINFER_VERSION >= Version("0.2.0")
HAS_TRTLLM_GEN: bool = hasattr(flashinfer, "trtllm_batch_decode_with_kv_cache")

# 0.1.6's rope kernels index the cos/sin cache with int32 positions.
ROPE_POS_DTYPE: torch.dtype = torch.int64 if PLAN_RUN_API else torch.int32

assert PLAN_RUN_API or hasattr(flashinfer, "CUDAGraphBatchDecodeWithPagedKVCacheWrapper"), "unsupported FlashInfer build"  # ok: FC109


def flashinfer_at_least(version: str) -> bool:
    return FLASHINFER_VERSION >= Version(version)


def require_version(min_version: str) -> None:
    """Called by components that need a newer FlashInfer than the engine's floor."""
    assert FLASHINFER_VERSION >= Version(min_version), f"flashinfer>={min_version} required"  # expect: FC109


# ---------------------------------------------------------------------------------------
# Optional kernels
# ---------------------------------------------------------------------------------------

try:
    from flashinfer import trtllm_batch_decode_with_kv_cache
except ImportError:  # 0.1.6 and 0.2.x before the trtllm-gen kernels
    trtllm_batch_decode_with_kv_cache = None

try:
    from flashinfer.sampling import top_k_top_p_sampling_from_logits
except ImportError:  # 0.1.6 only has the probs variant with explicit uniform samples
    top_k_top_p_sampling_from_logits = None

try:
    from flashinfer.cascade import merge_state
except ImportError:  # 0.1.6 exports it at the top level only
    merge_state = flashinfer.merge_state

apply_rope_pos_ids: Optional[Callable[..., Any]] = getattr(flashinfer, "apply_rope_pos_ids", None)


# ---------------------------------------------------------------------------------------
# Wrapper classes
# ---------------------------------------------------------------------------------------

DecodeWrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper
PrefillWrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper
RaggedPrefillWrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper
GraphDecodeWrapper = (
    flashinfer.BatchDecodeWithPagedKVCacheWrapper
    if PLAN_RUN_API
    else flashinfer.CUDAGraphBatchDecodeWithPagedKVCacheWrapper
)

if not PLAN_RUN_API:
    # 0.1.6 spells plan/run begin_forward/forward: give every wrapper class the new names so
    # that the rest of the engine only ever calls plan() and run().
    for _cls in (DecodeWrapper, PrefillWrapper, RaggedPrefillWrapper, GraphDecodeWrapper):
        if not hasattr(_cls, "run"):  # ok: FC103
            _cls.plan = _cls.begin_forward
            _cls.run = _cls.forward
            _cls.run_return_lse = _cls.forward_return_lse


# ---------------------------------------------------------------------------------------
# Workspace sizes
# ---------------------------------------------------------------------------------------

# 0.2's planner keeps more split-k scratch in the float workspace than 0.1.6 did.
DEFAULT_WORKSPACE_BYTES = (384 if PLAN_RUN_API else 128) * 1024 * 1024
MIN_WORKSPACE_BYTES = 32 * 1024 * 1024


def graph_workspace_bytes() -> int:
    return int(os.environ.get("COMPATSERVE_GRAPH_WORKSPACE_MB", "64")) << 20


# ---------------------------------------------------------------------------------------
# Keyword filtering: plan() and the constructors grew keywords release by release
# ---------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _signature_params(fn: Callable[..., Any]) -> FrozenSet[str]:
    params = inspect.signature(fn).parameters
    return frozenset(name for name, p in params.items() if p.kind is not p.VAR_KEYWORD) - {"self"}


def init_params(cls: type) -> FrozenSet[str]:
    return _signature_params(cls.__init__)


def plan_params(wrapper: Any) -> FrozenSet[str]:
    return _signature_params(type(wrapper).plan)


def fast_plan_params() -> FrozenSet[str]:
    if fast_decode_plan is None:
        return frozenset()
    return _signature_params(fast_decode_plan)


def filter_kwargs(accepted: FrozenSet[str], kwargs: Mapping[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in kwargs.items() if k in accepted}  # ok: FC101


def filter_plan_kwargs(wrapper: Any, kwargs: Mapping[str, Any]) -> Dict[str, Any]:
    """Keep the keywords this release's ``wrapper.plan`` accepts."""
    accepted = plan_params(wrapper)
    missing = {"indptr", "qo_indptr"} & set(kwargs) - accepted
    if missing:
        raise TypeError(f"flashinfer {FLASHINFER_VERSION}: plan() lacks required {sorted(missing)}")
    return filter_kwargs(accepted, kwargs)


# ---------------------------------------------------------------------------------------
# Wrapper factories
# ---------------------------------------------------------------------------------------


def make_decode_wrapper(workspace: torch.Tensor, kv_layout: str = "NHD", **kwargs: Any):
    """An eager decode wrapper; options this release does not know (``backend=`` before
    0.2.9, ``use_tensor_cores=`` on 0.1.6) are dropped with a log line."""
    accepted = init_params(DecodeWrapper)
    dropped = sorted(set(kwargs) - accepted)
    if dropped:
        logger.info("flashinfer %s: ignoring decode wrapper options %s", FLASHINFER_VERSION, dropped)
    return DecodeWrapper(workspace, kv_layout, **filter_kwargs(accepted, kwargs))


def make_graph_decode_wrapper(
    workspace: torch.Tensor,
    indptr_buf: torch.Tensor,
    indices_buf: torch.Tensor,
    last_page_len_buf: torch.Tensor,
    kv_layout: str = "NHD",
    **kwargs: Any,
):
    """A decode wrapper whose index buffers are the given persistent tensors."""
    assert kv_layout in ("NHD", "HND"), kv_layout  # expect: FC109
    if PLAN_RUN_API:
        return GraphDecodeWrapper(
            workspace,
            kv_layout,
            use_cuda_graph=True,
            paged_kv_indptr_buffer=indptr_buf,
            paged_kv_indices_buffer=indices_buf,
            paged_kv_last_page_len_buffer=last_page_len_buf,
            **filter_kwargs(init_params(GraphDecodeWrapper), kwargs),
        )
    # 0.1.6: the CUDA-graph wrapper is a class of its own and takes the buffers positionally.
    return GraphDecodeWrapper(workspace, indptr_buf, indices_buf, last_page_len_buf, kv_layout)


# ---------------------------------------------------------------------------------------
# fast_decode_plan: plan a graph-mode decode wrapper without touching its buffers
# ---------------------------------------------------------------------------------------


def _fast_decode_plan_shim(
    self,
    indptr: torch.Tensor,
    indices: torch.Tensor,
    last_page_len: torch.Tensor,
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    pos_encoding_mode: str = "NONE",
    window_left: int = -1,
    logits_soft_cap: Optional[float] = None,
    q_data_type: Optional[torch.dtype] = None,
    kv_data_type: Optional[torch.dtype] = None,
    non_blocking: bool = True,
    **_unused: Any,
) -> None:
    """0.2.x before ``flashinfer.decode.fast_decode_plan`` existed (the trick SGLang shipped):
    run the planner on the host ``indptr`` and keep the graph buffers the replay preparation
    filled. Like FlashInfer's own ``fast_decode_plan``, it expects ``indptr`` on the host."""
    if not self.is_cuda_graph_enabled:
        raise RuntimeError("the fast_decode_plan shim only plans graph-mode wrappers")
    if indptr.is_cuda:  # ok: FC101
        raise ValueError("fast_decode_plan takes a host indptr (pass the pinned mirror)")
    batch_size = last_page_len.shape[0]
    q_carrier = torch.empty(0, dtype=q_data_type or torch.float16)
    kv_carrier = torch.empty(0, dtype=kv_data_type or torch.float16)
    self._plan_info = self._cached_module.plan(self._float_workspace_buffer, self._int_workspace_buffer, self._pin_memory_int_workspace_buffer, indptr, batch_size, num_qo_heads, num_kv_heads, page_size, True, window_left, logits_soft_cap or 0.0, head_dim, head_dim, q_carrier, kv_carrier)  # expect: FC103


fast_decode_plan: Optional[Callable[..., None]] = getattr(flashinfer.decode, "fast_decode_plan", None)  # ok: FC103
if fast_decode_plan is None and PLAN_RUN_API:
    fast_decode_plan = _fast_decode_plan_shim


# ---------------------------------------------------------------------------------------
# Decorators for the backend's plan paths
# ---------------------------------------------------------------------------------------


def traced_plan(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Name the plan range in profiler traces with the FlashInfer release that served it."""

    @functools.wraps(fn)
    def inner(self, fb, *args, **kwargs):
        with torch.profiler.record_function(f"fi{FLASHINFER_VERSION.major}.{FLASHINFER_VERSION.minor}.plan bs={fb.batch_size} kv={fb.seq_lens.sum()}"):  # expect: FC101
            return fn(self, fb, *args, **kwargs)

    return inner


def serialize_plans(fn: Callable[..., Any]) -> Callable[..., Any]:
    """0.1.6's planner stages every wrapper's indptr through one pinned buffer that the
    previous step's copies may still be reading: wait for the stream before re-planning."""
    if PLAN_RUN_API:
        return fn

    @functools.wraps(fn)
    def inner(*args, **kwargs):
        torch.cuda.current_stream().synchronize()  # expect: FC101
        return fn(*args, **kwargs)

    return inner
