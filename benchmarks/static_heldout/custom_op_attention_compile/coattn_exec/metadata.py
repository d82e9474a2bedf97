from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper


@dataclasses.dataclass
class SchedulerBatch:
    """What the scheduler hands the runner: decodes first, then prefills (host arrays and the
    device tensors the model reads)."""

    num_reqs: int
    num_decodes: int
    query_lens_np: np.ndarray
    seq_lens_np: np.ndarray
    block_table_cpu: torch.Tensor
    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    evicted_blocks_cpu: Optional[torch.Tensor] = None

    @property
    def num_prefills(self) -> int:
        return self.num_reqs - self.num_decodes

    @property
    def is_pure_decode(self) -> bool:
        return self.num_prefills == 0


@dataclasses.dataclass
class AttnMetadata:
    num_actual_tokens: int
    num_decode_tokens: int
    num_prefills: int
    max_decode_seq_len: int
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper]
    prefill_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper]
    needs_window_mask: bool = False
    graph_size: Optional[int] = None
