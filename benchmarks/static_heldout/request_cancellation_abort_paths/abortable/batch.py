from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch


@dataclass
class DecodeBatch:
    request_ids: List[str]
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_loc: torch.Tensor
    last_page_len: torch.Tensor
    seq_lens_np: np.ndarray
    page_lists: List[List[int]]
    is_decode: bool = True
    qo_indptr_cpu: Optional[torch.Tensor] = None

    @property
    def batch_size(self) -> int:
        return len(self.request_ids)

    @classmethod
    def from_host(cls, request_ids, input_ids_np, positions_np, out_loc_np, seq_lens_np, page_lists, page_size,
                  device, qo_indptr_np=None):
        def dev(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(a).pin_memory().to(device, non_blocking=True)

        last_np = ((seq_lens_np - 1) % page_size + 1).astype(np.int32)
        return cls(
            request_ids=list(request_ids),
            input_ids=dev(input_ids_np),
            positions=dev(positions_np),
            out_loc=dev(out_loc_np),
            last_page_len=dev(last_np),
            seq_lens_np=seq_lens_np,
            page_lists=page_lists,
            is_decode=qo_indptr_np is None,
            qo_indptr_cpu=None if qo_indptr_np is None else torch.from_numpy(qo_indptr_np),
        )
