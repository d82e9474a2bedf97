"""Per-step records of the layout-aware server."""

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch


@dataclass
class LayoutBatch:
    rids: list
    input_ids: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_np: np.ndarray
    row_layout: torch.Tensor
    row_layout_np: np.ndarray
    pages: list
    tail_pages: list
    nhd_write_pages: torch.Tensor
    hnd_write_pages: torch.Tensor
    write_offsets: torch.Tensor
    graph_bs: Optional[int] = None

    @property
    def size(self) -> int:
        return len(self.rids)

    @property
    def has_tail(self) -> bool:
        return any(len(t) > 0 for t in self.tail_pages)


@dataclass
class LayoutMetadata:
    graph_bs: Optional[int]
    row_layout: torch.Tensor
    has_tail: bool
    use_trtllm: bool = False
    seq_lens: Optional[torch.Tensor] = None
    block_tables: Optional[torch.Tensor] = None
    max_len: int = 0
