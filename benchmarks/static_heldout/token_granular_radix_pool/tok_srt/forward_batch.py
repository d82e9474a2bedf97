from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING, Optional

import torch

if TYPE_CHECKING:
    from tok_srt.flashinfer_backend import FlashInferAttnBackend
    from tokpool.memory_pool import BaseTokenToKVPool


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2
    TARGET_VERIFY = 3

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_target_verify(self) -> bool:
        return self == ForwardMode.TARGET_VERIFY


@dataclasses.dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    seq_lens_sum: int
    out_cache_loc: torch.Tensor
    attn_backend: "FlashInferAttnBackend"
    token_to_kv_pool: "BaseTokenToKVPool"
    extend_prefix_lens: Optional[torch.Tensor] = None
    extend_prefix_lens_cpu: Optional[torch.Tensor] = None
    spec_custom_mask: Optional[torch.Tensor] = None
