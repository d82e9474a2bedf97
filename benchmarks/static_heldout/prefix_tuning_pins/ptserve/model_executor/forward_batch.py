from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch

if TYPE_CHECKING:
    from ptserve.layers.flashinfer_backend import PrefixTuningAttnBackend


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2
    IDLE = 3

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_extend(self) -> bool:
        return self == ForwardMode.EXTEND


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor  # device
    seq_lens_cpu: torch.Tensor
    prefix_lens: torch.Tensor  # device: soft-prompt tokens of each row's tenant
    tenant_ids: torch.Tensor  # device, slot of each row's tenant
    tenant_ids_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor  # device
    kv_last_page_len_cpu: torch.Tensor
    attn_backend: "PrefixTuningAttnBackend"
    extend_seq_lens: Optional[torch.Tensor] = None  # device
    extend_qo_indptr_cpu: Optional[torch.Tensor] = None
    extend_num_tokens: int = 0
    all_shared_prompt: bool = False
    position_offsets: Optional[torch.Tensor] = None
    token_req: Optional[torch.Tensor] = None
