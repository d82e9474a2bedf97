from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class CommonAttentionMetadata:
    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    num_reqs: int
    num_actual_tokens: int
    block_table_tensor: torch.Tensor


@dataclass
class MLADecodeMetadata:
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    max_seq_len: int


@dataclass
class MLAMetadata:
    num_decodes: int
    num_prefills: int
    decode: Optional[MLADecodeMetadata]
    prefill_query_start_loc: Optional[torch.Tensor]
