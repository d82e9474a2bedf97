"""What every attention backend of the chain implements, and the step inputs they share."""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar, Optional, Tuple

import torch

from fbchain.capability import DeviceCaps


@dataclass
class StepInputs:
    num_reqs: int
    num_tokens: int
    is_decode: bool
    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    seq_lens: torch.Tensor               # device
    seq_lens_cpu: torch.Tensor           # pinned
    qo_indptr: torch.Tensor              # device
    qo_indptr_cpu: torch.Tensor
    kv_indptr: torch.Tensor              # device (the Triton fallback reads it)
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor             # device
    kv_last_page_len_cpu: torch.Tensor
    block_table: torch.Tensor            # device, (num_reqs, max_pages) for trtllm-gen
    window_layers: Tuple[int, ...] = ()

    @property
    def max_seq_len(self) -> torch.Tensor:
        return self.seq_lens.max()


class AttentionBackendBase(abc.ABC):
    name: ClassVar[str] = "base"

    @classmethod
    @abc.abstractmethod
    def supports(cls, caps: DeviceCaps, dtype: torch.dtype, head_dim: int) -> bool: ...

    def plan(self, inputs: StepInputs) -> None:
        """Backends without a planner have nothing to do before the forward."""

    @abc.abstractmethod
    def forward_decode(
        self, q: torch.Tensor, kv: torch.Tensor, inputs: StepInputs, layer_idx: int, graph_wrapper: Optional[object] = None
    ) -> torch.Tensor: ...

    @abc.abstractmethod
    def forward_prefill(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: torch.Tensor, inputs: StepInputs, layer_idx: int
    ) -> torch.Tensor: ...
