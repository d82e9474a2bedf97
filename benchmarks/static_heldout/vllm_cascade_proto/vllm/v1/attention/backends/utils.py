from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch


@dataclass(slots=True)
class CommonAttentionMetadata:
    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    num_reqs: int
    num_actual_tokens: int
    block_table_tensor: torch.Tensor


class CascadePlan(NamedTuple):
    shared_qo_indptr_cpu: torch.Tensor
    shared_kv_page_indptr_cpu: torch.Tensor
    shared_kv_last_page_len_cpu: torch.Tensor
    shared_kv_page_indices: torch.Tensor


class AttentionMetadataBuilderProto(Protocol):
    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata): ...

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata): ...
