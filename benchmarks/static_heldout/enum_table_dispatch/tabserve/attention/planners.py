"""Plan functions, and the recipes that tie each to a backend wrapper, a feature and a forward mode."""

from __future__ import annotations

import dataclasses
import enum
import functools
import operator
from typing import Callable, Dict, Optional, Tuple

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from tabserve.batch import ForwardBatch
from tabserve.modes import Feature, ForwardMode


@dataclasses.dataclass(frozen=True)
class HeadSpec:
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: torch.dtype

    def shape_args(self) -> Tuple[int, int, int, int]:
        """Positional shape arguments shared by the decode and paged prefill ``plan()``."""
        return (self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size)


@dataclasses.dataclass
class PlanBuffers:
    """Index buffers every wrapper plans from: device tensors the kernels read, pinned host mirrors."""

    kv_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    qo_indptr: torch.Tensor
    qo_indptr_cpu: torch.Tensor

    @classmethod
    def allocate(cls, max_bs: int, max_pages: int, device: torch.device) -> "PlanBuffers":
        return cls(
            kv_indptr=torch.zeros(max_bs + 1, dtype=torch.int32, device=device),
            kv_indptr_cpu=torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True),
            kv_indices=torch.zeros(max_pages, dtype=torch.int32, device=device),
            kv_last_page_len=torch.ones(max_bs, dtype=torch.int32, device=device),
            kv_last_page_len_cpu=torch.ones(max_bs, dtype=torch.int32, pin_memory=True),
            qo_indptr=torch.zeros(max_bs + 1, dtype=torch.int32, device=device),
            qo_indptr_cpu=torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True),
        )


@dataclasses.dataclass
class PlanSlot:
    """A recorded decode bucket: its graph-mode wrapper and the padded batch it plans for."""

    mode: ForwardMode
    batch_size: int
    wrapper: BatchDecodeWithPagedKVCacheWrapper


# ``slot_plan(slot)`` is the bound ``plan`` of the slot's wrapper.
slot_plan = operator.attrgetter("wrapper.plan")


def plan_paged_decode(
    wrapper: BatchDecodeWithPagedKVCacheWrapper,
    bufs: PlanBuffers,
    fb: ForwardBatch,
    heads: HeadSpec,
    *,
    window_left: int = -1,
    logits_soft_cap: Optional[float] = None,
) -> None:
    bs = fb.padded_batch_size
    total = int(bufs.kv_indptr_cpu[bs])
    wrapper.plan(  # ok: FC102
        bufs.kv_indptr_cpu[: bs + 1],
        bufs.kv_indices[:total],
        bufs.kv_last_page_len_cpu[:bs],
        *heads.shape_args(),
        window_left=window_left,
        logits_soft_cap=logits_soft_cap,
        q_data_type=heads.dtype,
        kv_data_type=heads.dtype,
    )


def plan_paged_extend(
    wrapper: BatchPrefillWithPagedKVCacheWrapper,
    bufs: PlanBuffers,
    fb: ForwardBatch,
    heads: HeadSpec,
    *,
    causal: bool,
    logits_soft_cap: Optional[float] = None,
) -> None:
    """Paged prefill over the cached prefix; batches without one go through the ragged wrapper."""
    prefix_lens = fb.extend_prefix_lens_cpu or []
    if not any(prefix_lens):  # ok: FC101
        return
    bs = fb.batch_size
    wrapper.plan(
        bufs.qo_indptr_cpu[: bs + 1],
        bufs.kv_indptr_cpu[: bs + 1],
        bufs.kv_indices,
        bufs.kv_last_page_len_cpu[:bs],
        *heads.shape_args(),
        causal=causal,
        logits_soft_cap=logits_soft_cap,
        q_data_type=heads.dtype,
        kv_data_type=heads.dtype,
    )


def plan_paged_verify(
    wrapper: BatchPrefillWithPagedKVCacheWrapper,
    bufs: PlanBuffers,
    fb: ForwardBatch,
    heads: HeadSpec,
    *,
    causal: bool,
    logits_soft_cap: Optional[float] = None,
) -> None:
    """Target verification of ``num_draft_tokens`` per request under the drafter's tree mask."""
    bs = fb.batch_size
    custom_mask = fb.custom_mask
    if custom_mask is not None and not custom_mask.any():  # expect: FC101
        # An all-False mask means chain drafts: plain causal attention is the same thing.
        custom_mask, causal = None, True
    wrapper.plan(  # expect: FC102
        bufs.qo_indptr[: bs + 1],
        bufs.kv_indptr_cpu[: bs + 1],
        bufs.kv_indices,
        bufs.kv_last_page_len_cpu[:bs],
        *heads.shape_args(),
        custom_mask=custom_mask,
        causal=causal,
        logits_soft_cap=logits_soft_cap,
        q_data_type=heads.dtype,
        kv_data_type=heads.dtype,
    )


class PlanRecipe(enum.Enum):
    """Which backend wrapper a mode plans, the feature that enables it, and its planner."""

    DECODE = ("decode_wrapper", Feature.NONE, functools.partial(plan_paged_decode, window_left=-1))
    SWA_DECODE = ("swa_decode_wrapper", Feature.SLIDING_WINDOW, functools.partial(plan_paged_decode))
    EXTEND_PREFIX = ("prefill_wrapper_paged", Feature.NONE, functools.partial(plan_paged_extend, causal=False))
    VERIFY = ("verify_wrapper", Feature.SPEC_VERIFY, functools.partial(plan_paged_verify, causal=False))

    def __init__(self, wrapper_attr: str, feature: Feature, planner: Callable[..., None]) -> None:
        self.wrapper_attr = wrapper_attr
        self.feature = feature
        self.planner = planner


RECIPES_BY_MODE: Dict[ForwardMode, Tuple[PlanRecipe, ...]] = {
    ForwardMode.DECODE: (PlanRecipe.DECODE, PlanRecipe.SWA_DECODE),
    ForwardMode.EXTEND: (PlanRecipe.EXTEND_PREFIX,),
    ForwardMode.TARGET_VERIFY: (PlanRecipe.VERIFY,),
}
