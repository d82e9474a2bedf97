"""Per-step records handed between the scheduler, the planner thread, the plan pool and the step."""
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch


@dataclass
class StepBatch:
    step_id: int
    batch_size: int
    is_decode: bool
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    req_slots: torch.Tensor
    req_slots_cpu: torch.Tensor
    extend_lens_cpu: Optional[torch.Tensor] = None


@dataclass(frozen=True)
class HostPlan:  # what the planner thread computed for one step: numpy only, never on the GPU
    step_id: int
    bucket: int
    batch_size: int
    kv_indptr: np.ndarray
    kv_indices: np.ndarray
    last_page_len: np.ndarray
    win_indptr: np.ndarray
    win_indices: np.ndarray
    qo_indptr: Optional[np.ndarray] = None


@dataclass
class GraphBuffers:  # device buffers a bucket's graph-mode wrappers were built on, plus pinned mirrors
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len: torch.Tensor
    win_indptr: torch.Tensor
    win_indices: torch.Tensor
    indptr_host: torch.Tensor
    win_indptr_host: torch.Tensor
    last_page_len_host: torch.Tensor


@dataclass
class PlanTicket:
    batch: StepBatch
    plan: HostPlan
    future: Optional[Future] = None
    scratch: Optional[torch.Tensor] = None
