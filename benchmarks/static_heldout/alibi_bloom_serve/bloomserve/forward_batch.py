from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE


@dataclass
class ChunkMeta:
    """One chunk of a prompt longer than `chunked_prefill_size`, attending to everything before it."""

    qo_indptr: torch.Tensor
    kv_indptr_host: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len_host: torch.Tensor

    @classmethod
    def from_lengths(cls, chunk_lens: List[int], prefix_lens: List[int], kv_indices: torch.Tensor) -> "ChunkMeta":
        qo = np.zeros(len(chunk_lens) + 1, dtype=np.int32)
        np.cumsum(chunk_lens, out=qo[1:])
        kv = np.zeros(len(chunk_lens) + 1, dtype=np.int32)
        np.cumsum(np.asarray(chunk_lens) + np.asarray(prefix_lens), out=kv[1:])
        return cls(
            qo_indptr=torch.from_numpy(qo).cuda(),
            kv_indptr_host=torch.from_numpy(kv),
            kv_indices=kv_indices,
            kv_last_page_len_host=torch.ones(len(chunk_lens), dtype=torch.int32),
        )


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    extend_seq_lens: Optional[torch.Tensor] = None
    extend_seq_lens_cpu: Optional[List[int]] = None
    extend_num_tokens: int = 0
    long_prompt_chunks: Optional[ChunkMeta] = None
