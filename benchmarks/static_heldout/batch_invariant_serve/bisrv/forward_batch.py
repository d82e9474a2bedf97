from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, Optional

import numpy as np
import torch

if TYPE_CHECKING:
    from bisrv.layers.attention_backend import FixedSplitFlashInferBackend


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
    attn_backend: "FixedSplitFlashInferBackend"
    input_ids: torch.Tensor
    positions: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor  # device
    seq_lens_np: np.ndarray
    out_cache_loc: torch.Tensor
    # sampling: one Philox stream per request
    seeds: torch.Tensor
    sampling_steps: torch.Tensor
    temperatures: torch.Tensor
    seed_list: List[int] = field(default_factory=list)
    # extend only
    extend_lens: Optional[torch.Tensor] = None
    extend_lens_np: Optional[np.ndarray] = None
    extend_prefix_lens_np: Optional[np.ndarray] = None
    extend_num_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]
