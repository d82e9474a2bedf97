from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import torch

if TYPE_CHECKING:
    from ..layers.attention.flashinfer_backend import FlashInferAttnBackend


class ForwardMode(enum.Enum):
    EXTEND = 1
    DECODE = 2
    TARGET_VERIFY = 3

    def is_decode(self) -> bool:
        return self is ForwardMode.DECODE

    def is_target_verify(self) -> bool:
        return self is ForwardMode.TARGET_VERIFY

    def is_cuda_graph(self) -> bool:
        return self in (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY)


@dataclass
class NgramVerifyInput:
    draft_token: torch.Tensor  # (bs * draft_token_num,)
    positions: torch.Tensor
    custom_mask: torch.Tensor  # flattened bool tree masks, one (draft x (prefix + draft)) block per request
    draft_token_num: int
    draft_lens_cpu: list[int] = field(default_factory=list)
    mask_ready: Optional[torch.cuda.Event] = None


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    out_cache_loc: torch.Tensor
    attn_backend: "FlashInferAttnBackend"
    token_to_kv_pool: object
    spec_info: Optional[NgramVerifyInput] = None
