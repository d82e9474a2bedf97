from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import List, Optional

import numpy as np
import torch


class KVPoll(IntEnum):
    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


@dataclass
class KVArgs:
    engine_rank: int
    kv_data_ptrs: List[int]
    kv_data_lens: List[int]
    kv_item_lens: List[int]
    aux_data_ptrs: List[int]
    aux_data_lens: List[int]
    aux_item_lens: List[int]
    ib_device: Optional[str] = None
    gpu_id: int = 0


def kv_to_page_indices(kv_indices: np.ndarray, page_size: int) -> np.ndarray:
    if page_size == 1:
        return kv_indices
    return np.unique(kv_indices // page_size)  # ok: FC101


class MetadataBuffers:
    """Host buffers registered with the transfer engine; the prefill side writes them over RDMA."""

    def __init__(self, size: int):
        self.output_ids = torch.zeros((size, 16), dtype=torch.int32, device="cpu")
        self.output_token_logprobs = torch.zeros((size, 16), dtype=torch.float32, device="cpu")

    def get_buf_infos(self):
        ptrs = [self.output_ids.data_ptr(), self.output_token_logprobs.data_ptr()]
        lens = [self.output_ids.nbytes, self.output_token_logprobs.nbytes]
        items = [self.output_ids[0].nbytes, self.output_token_logprobs[0].nbytes]
        return ptrs, lens, items
