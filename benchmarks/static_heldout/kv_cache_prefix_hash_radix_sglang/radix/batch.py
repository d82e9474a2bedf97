from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, Optional

import torch

if TYPE_CHECKING:
    from radix.radix_cache import TreeNode
    from rx_attn.flashinfer_backend import FlashInferAttnBackend


@dataclass
class Req:
    rid: int
    token_ids: List[int]
    pool_row: int = -1
    prefix_len: int = 0
    last_node: Optional["TreeNode"] = None
    output_ids: List[int] = field(default_factory=list)

    @property
    def seq_len(self) -> int:
        return len(self.token_ids) + len(self.output_ids)


@dataclass
class ForwardBatch:
    forward_mode: str
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    out_cache_loc: torch.Tensor
    attn_backend: "FlashInferAttnBackend"
    qo_indptr_cpu: Optional[torch.Tensor] = None
