from dataclasses import dataclass
from typing import Optional

import torch

from g3engine import LayerKind


@dataclass
class StepBatch:
    batch_size: int
    is_decode: bool
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    qo_indptr: Optional[torch.Tensor] = None
    qo_indptr_cpu: Optional[torch.Tensor] = None

    @classmethod
    def from_host(cls, input_ids_cpu, positions_cpu, seq_lens_cpu, qo_indptr_cpu, device, is_decode):
        def dev(t):
            return None if t is None else t.to(device, non_blocking=True)
        return cls(int(seq_lens_cpu.shape[0]), is_decode, dev(input_ids_cpu), dev(positions_cpu), dev(seq_lens_cpu),
                   seq_lens_cpu, qo_indptr=dev(qo_indptr_cpu), qo_indptr_cpu=qo_indptr_cpu)


@dataclass
class FamilyPlanInputs:
    """What one wrapper family is planned with for one step."""
    kind: LayerKind
    indptr: torch.Tensor
    indices: torch.Tensor
    last_page_len: torch.Tensor
    page_size: int
    window_left: int


@dataclass
class GlobalGraphBuffers:
    """Buffers bound to the global decode wrappers of every bucket, and their pinned mirrors."""
    indptr: torch.Tensor
    indices: torch.Tensor
    last_page_len: torch.Tensor
    indptr_cpu: torch.Tensor
    indices_cpu: torch.Tensor
