"""Typed attention metadata, the plan()/constructor argument dicts and their layered defaults."""
import dataclasses
from collections import ChainMap
from typing import Any, Dict, TypedDict, Unpack

import torch

PAGE_SIZE = 16
GRAPH_BATCH_SIZES = [1, 2, 4, 8, 16, 24, 32, 48, 64]
assert GRAPH_BATCH_SIZES == sorted(GRAPH_BATCH_SIZES), "capture order relies on sorted buckets"  # ok: FC109

_WS_BYTES = {"prefill": 384 << 20, "softcap": 32 << 20}
WS_SIZES = ChainMap({"softcap": 48 << 20}, _WS_BYTES)  # per-deployment overrides in front of the built-ins


@dataclasses.dataclass
class ServeConfig:
    num_layers: int = 32
    hidden_size: int = 4096
    vocab_size: int = 151936
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = PAGE_SIZE
    max_running_requests: int = 256
    max_context_len: int = 32768
    max_num_tokens: int = 16384
    sliding_window: int = 4096
    window_layers: tuple = ()
    softcap_layers: tuple = ()
    logits_soft_cap: float = 30.0
    num_draft_tokens: int = 4
    trtllm_direct_decode: bool = True
    decode_workspace_bytes: int = 256 << 20
    device: str = "cuda"


class PlanKwargs(TypedDict, total=False):
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    head_dim_qk: int
    page_size: int
    pos_encoding_mode: str
    window_left: int
    logits_soft_cap: float
    q_data_type: torch.dtype
    kv_data_type: torch.dtype


class WrapperKwargs(TypedDict, total=False):
    use_cuda_graph: bool
    backend: str
    paged_kv_indptr_buffer: torch.Tensor
    paged_kv_indices_buffer: torch.Tensor
    paged_kv_last_page_len_buffer: torch.Tensor


class ForwardBatch(TypedDict):
    mode: str  # "decode" | "extend" | "verify"
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    extend_prefix_lens: torch.Tensor
    extend_prefix_lens_cpu: torch.Tensor
    extend_seq_lens: torch.Tensor


class DecodeMeta(TypedDict, total=False):
    batch_size: int
    seq_lens: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    block_tables: torch.Tensor  # trtllm-gen direct path only
    max_seq_len: int
    wrapper: Any
    softcap_wrapper: Any


class PrefillMeta(TypedDict, total=False):
    num_tokens: int
    qo_indptr: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    use_ragged: bool
    wrapper: Any


PLAN_DEFAULTS: PlanKwargs = {"page_size": PAGE_SIZE, "pos_encoding_mode": "NONE",
                             "q_data_type": torch.bfloat16, "kv_data_type": torch.bfloat16}
WRAPPER_DEFAULTS: WrapperKwargs = {"use_cuda_graph": False, "backend": "fa2"}
BACKEND_OVERRIDES: Dict[str, WrapperKwargs] = {
    "decode": {"backend": "trtllm-gen"},  # Blackwell decode kernels, eager and graph-mode alike
    "window": {},
    "softcap": {"backend": "fa2"},
    "prefill": {"backend": "fa2"},
}


def wrapper_kwargs(kind: str, **extra: Unpack[WrapperKwargs]) -> ChainMap:
    """Constructor arguments: call-site extras over the backend's overrides over the defaults."""
    assert kind in BACKEND_OVERRIDES, f"unknown wrapper kind {kind}"  # expect: FC109
    return ChainMap(dict(extra), BACKEND_OVERRIDES[kind], WRAPPER_DEFAULTS)


def merge_plan_kwargs(base: PlanKwargs, **kwargs: Unpack[PlanKwargs]) -> PlanKwargs:
    assert kwargs.get("page_size", PAGE_SIZE) == PAGE_SIZE, "the KV pool has one page size"  # expect: FC109
    return base | kwargs


def prefill_plan_kwargs(kw: PlanKwargs, paged: bool) -> PlanKwargs:
    """Prefill plan() spells the head dimension head_dim_qk, and a ragged plan takes no page size."""
    out: PlanKwargs = {("head_dim_qk" if k == "head_dim" else k): v for k, v in kw.items()}  # type: ignore[misc]
    return out if paged else {k: v for k, v in out.items() if k != "page_size"}  # type: ignore[return-value]
