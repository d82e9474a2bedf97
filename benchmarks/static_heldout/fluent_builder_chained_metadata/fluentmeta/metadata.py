"""Per-step batch description and the frozen metadata the builders return."""
from dataclasses import dataclass
from typing import Any, Optional

import torch


@dataclass
class ForwardBatch:
    batch_size: int
    is_decode: bool
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    req_pool_indices: torch.Tensor
    extend_seq_lens: Optional[torch.Tensor] = None
    extend_seq_lens_cpu: Optional[torch.Tensor] = None
    extend_prefix_lens_cpu: Optional[torch.Tensor] = None


@dataclass(frozen=True)
class DecodeMetadata:
    batch_size: int
    wrapper: Any
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor

    @property
    def num_pages(self) -> int:
        return int(self.kv_indptr[self.batch_size])  # expect: FC101


@dataclass(frozen=True)
class PrefillMetadata:
    qo_indptr: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    use_ragged: bool

    @property
    def num_tokens(self) -> int:
        return int(self.qo_indptr_cpu[-1])  # ok: FC101

