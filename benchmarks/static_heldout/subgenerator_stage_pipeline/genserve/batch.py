"""What flows between the stages of a step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

import numpy as np
import torch


@dataclass
class Request:
    rid: int
    prompt_ids: List[int]
    max_new_tokens: int
    output_ids: List[int] = field(default_factory=list)
    pages: List[int] = field(default_factory=list)
    shared_prefix_pages: int = 0

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def is_prefill(self) -> bool:
        return not self.output_ids

    @property
    def finished(self) -> bool:
        return len(self.output_ids) >= self.max_new_tokens


@dataclass
class StageEvent:
    """What a stage yields to the driver; the driver answers through ``send()``."""

    kind: str
    payload: Any = None


@dataclass
class PageGrant:
    page_ids_cpu: torch.Tensor
    page_ids: torch.Tensor


@dataclass
class ScheduledBatch:
    requests: List[Request]
    is_prefill: bool
    input_ids_cpu: torch.Tensor
    positions_cpu: torch.Tensor
    qo_lens_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    seq_lens: torch.Tensor
    num_pages_cpu: torch.Tensor
    page_table: np.ndarray

    @property
    def batch_size(self) -> int:
        return len(self.requests)

    @property
    def num_tokens(self) -> int:
        return self.input_ids_cpu.numel()


@dataclass
class SharedPrefix:
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len: int


@dataclass
class StepMeta:
    batch_size: int
    bucket: Optional[int]
    is_prefill: bool
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    qo_indptr: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    max_len: int
    shared_prefix: Optional[SharedPrefix] = None

    @property
    def shape_key(self) -> tuple:
        return (self.batch_size, self.bucket, self.max_len // 256)


@dataclass
class StepOutput:
    requests: List[Request]
    next_tokens: torch.Tensor

    @classmethod
    def empty(cls, device: torch.device) -> "StepOutput":
        return cls(requests=[], next_tokens=torch.empty(0, dtype=torch.int64, device=device))
