from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING, List, Optional

import torch

if TYPE_CHECKING:
    from span_srt.backend import MixedSpanAttnBackend
    from span_srt.metadata import SpanForwardMetadata


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE


@dataclasses.dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    req_slots: torch.Tensor
    req_slots_cpu: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    out_locs: List[torch.Tensor]  # per head group: flat token slot in that group's pool
    attn_backend: "MixedSpanAttnBackend"
    extend_lens_cpu: Optional[torch.Tensor] = None
    extend_qo_indptr: Optional[torch.Tensor] = None
    extend_qo_indptr_cpu: Optional[torch.Tensor] = None
    attn_meta: Optional["SpanForwardMetadata"] = None

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]
