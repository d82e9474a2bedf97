"""Per-family wrapper configuration: which FlashInfer wrappers a family needs, and how to plan them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from mfserve import FamilySpec, ServeConfig
from mf_attn.workspace import make_decode_workspace, make_window_workspace


@dataclass
class FamilyWrapperSet:
    decode: BatchDecodeWithPagedKVCacheWrapper
    window: Optional[BatchDecodeWithPagedKVCacheWrapper] = None


def plan_kwargs(spec: FamilySpec) -> Dict[str, Any]:
    return dict(
        pos_encoding_mode=spec.pos_encoding_mode,
        logits_soft_cap=spec.attn_soft_cap,
        q_data_type=torch.bfloat16,
    )


def make_window_wrapper(workspace: torch.Tensor) -> BatchDecodeWithPagedKVCacheWrapper:
    # local layers read few pages per row; tensor cores win for the wide GQA groups
    return BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=True)


def make_family_wrappers(spec: FamilySpec, cfg: ServeConfig, device: torch.device) -> FamilyWrapperSet:
    ws = make_decode_workspace(cfg.decode_workspace_bytes(spec), device)
    decode = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", backend=spec.decode_backend)
    window = make_window_wrapper(make_window_workspace(cfg, device)) if spec.window else None
    return FamilyWrapperSet(decode=decode, window=window)


def make_bucket_wrapper(
    workspace: torch.Tensor, bufs: Dict[str, torch.Tensor], bs: int
) -> BatchDecodeWithPagedKVCacheWrapper:
    return BatchDecodeWithPagedKVCacheWrapper(
        workspace,
        "NHD",
        use_cuda_graph=True,
        paged_kv_indptr_buffer=bufs["kv_indptr"][: bs + 1],
        paged_kv_indices_buffer=bufs["kv_indices"],
        paged_kv_last_page_len_buffer=bufs["kv_last_page_len"][:bs],
        backend="fa2",
    )


def make_alibi_stage(wrapper: BatchDecodeWithPagedKVCacheWrapper) -> Callable[..., torch.Tensor]:
    """ALiBi families run every layer through one decode wrapper planned with pos_encoding_mode=ALIBI."""

    def stage(q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return wrapper.run(q, kv_cache)  # expect: FC108

    return stage
