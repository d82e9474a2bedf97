"""Wrapper factories typed with ``typing.overload``, and the per-step metadata ``run_attention`` dispatches on."""
import dataclasses
from typing import Literal, Optional, overload

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper

from sdengine.config import AttentionConfig


def plan_dims(cfg: AttentionConfig) -> tuple:
    return cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size


@overload
def make_wrapper(kind: Literal["decode", "window"], workspace: torch.Tensor) -> BatchDecodeWithPagedKVCacheWrapper: ...
@overload
def make_wrapper(kind: Literal["ragged"], workspace: torch.Tensor) -> BatchPrefillWithRaggedKVCacheWrapper: ...


def make_wrapper(kind, workspace, kv_layout="NHD"):
    assert workspace.dtype == torch.uint8, "FlashInfer workspaces are byte buffers"  # expect: FC109
    if kind in ("decode", "window"):
        return BatchDecodeWithPagedKVCacheWrapper(workspace, kv_layout, use_tensor_cores=True)
    if kind == "ragged":
        return BatchPrefillWithRaggedKVCacheWrapper(workspace, kv_layout)
    raise ValueError(f"unknown wrapper kind {kind!r}")


@dataclasses.dataclass
class DecodeMeta:
    wrapper: BatchDecodeWithPagedKVCacheWrapper
    window_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper]
    bs: int
    seq_lens: Optional[torch.Tensor] = None


@dataclasses.dataclass
class PrefillMeta:
    wrapper: BatchPrefillWithRaggedKVCacheWrapper
    num_tokens: int
    token_to_req: torch.Tensor
    fresh_rows: torch.Tensor


class TrtllmMeta:
    def __init__(self, bs: int, seq_lens: torch.Tensor, graph: bool) -> None:
        self.bs, self.graph = bs, graph
        self.seq_lens = seq_lens.clone()  # ok: FC107
