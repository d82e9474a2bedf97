"""Per-request and per-step records."""

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch


@dataclass
class Request:
    rid: int
    token_ids: list
    page_ids: np.ndarray
    seq_len: int
    extend_len: int = 0
    prompt_span_start: int = 0
    finished: bool = False

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    kv_indices: torch.Tensor
    write_pages: torch.Tensor
    write_offsets: torch.Tensor
    is_decode: bool
    extend_lens: Optional[torch.Tensor] = None
    qo_indptr: Optional[torch.Tensor] = None
    num_tokens: int = 0
    graph_bs: Optional[int] = None


@dataclass
class StepMetadata:
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len: torch.Tensor
    seq_lens: torch.Tensor
    graph_bs: Optional[int] = None
    use_trtllm: bool = False
    max_seq_len_host: int = 0
    block_tables: Optional[torch.Tensor] = None
    extra: dict = field(default_factory=dict)
