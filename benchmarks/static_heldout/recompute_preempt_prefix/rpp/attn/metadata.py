from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)


@dataclass
class CommonAttentionMetadata:
    """Per-step batch description shared by every attention backend. Rows are
    ordered decodes first; `*_cpu` fields are pinned host mirrors."""

    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    num_computed_tokens_cpu: torch.Tensor
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    block_table_tensor: torch.Tensor
    slot_mapping: torch.Tensor


@dataclass
class FlashInferMetadata:
    num_actual_tokens: int
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    num_prefill_tokens: int
    slot_mapping: torch.Tensor
    prefill_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper | BatchPrefillWithRaggedKVCacheWrapper] = None
    use_ragged_prefill: bool = False
    decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
    # FP8 KV: a tensor-core decode wrapper that dequantizes on the fly
    fp8_decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
    # trtllm-gen decode (Blackwell): no wrapper, the kernel takes block tables
    trtllm_workspace: Optional[torch.Tensor] = None
    block_table: Optional[torch.Tensor] = None
    seq_lens: Optional[torch.Tensor] = None
    max_seq_len: int = 0
