"""Per-step batch and attention metadata."""

from dataclasses import dataclass
from typing import Any, Optional, Union

import torch


@dataclass
class DecodeMetadata:
    decode_wrapper: Any  # eager BatchDecodeWithPagedKVCacheWrapper or a CUDA-graph one
    seq_lens: torch.Tensor
    req_to_page: torch.Tensor
    req_pool_indices: torch.Tensor
    kernel: str = "fa2"
    trtllm_workspace: Optional[torch.Tensor] = None
    xqa_workspace: Optional[torch.Tensor] = None
    max_seq_len: int = 0


@dataclass
class ExtendMetadata:
    prefill_wrapper: Any
    num_tokens: int


AttnMetadata = Union[DecodeMetadata, ExtendMetadata]


@dataclass
class ForwardBatch:
    batch_size: int
    is_decode: bool
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    seq_lens: torch.Tensor  # device
    seq_lens_cpu: torch.Tensor  # host copy kept by the scheduler
    req_pool_indices: torch.Tensor
    extend_lens: Optional[torch.Tensor] = None  # device, extend only
    temperatures: Optional[torch.Tensor] = None
    attn: Optional[AttnMetadata] = None
