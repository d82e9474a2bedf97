"""The per-step batch, the forward metadata the layers read back, and the per-bucket graph record."""
from dataclasses import dataclass
from typing import Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

@dataclass
class ForwardBatch:
    is_decode: bool
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    req_pool_indices: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    qo_indptr: Optional[torch.Tensor] = None
    qo_indptr_cpu: Optional[torch.Tensor] = None
    prefix_lens: Optional[torch.Tensor] = None

@dataclass
class ForwardMetadata:
    """Published as CURRENT_META for the forward; attention helpers pick their wrappers from it."""
    decode_wrapper: BatchDecodeWithPagedKVCacheWrapper
    window_wrapper: BatchDecodeWithPagedKVCacheWrapper
    prefix_wrapper: BatchPrefillWithPagedKVCacheWrapper
    kv_indptr: torch.Tensor
    kv_last_page_len: torch.Tensor
    seq_lens: torch.Tensor
    shared_prefix_len: int = 0
    use_ragged: bool = False

class GraphState:
    """Per-bucket capture record; CURRENT_GRAPH holds the one being captured or replayed."""
    def __init__(self, graph: torch.cuda.CUDAGraph, bs: int, input_ids: torch.Tensor, positions: torch.Tensor):
        self.graph, self.bs, self.input_ids, self.positions = graph, bs, input_ids, positions
        self.logits: Optional[torch.Tensor] = None
