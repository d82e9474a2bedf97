"""The per-step batch handed to the model as the `forward_batch=` keyword (and so to every hook)."""

import enum
from dataclasses import dataclass

import torch


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    num_pages: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    # device copies, read by the kernels
    seq_lens: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    block_tables: torch.Tensor
    # pinned host mirrors, read by the planners
    seq_lens_cpu: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    raw_decode: bool = False
