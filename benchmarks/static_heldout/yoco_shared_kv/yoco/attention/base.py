from __future__ import annotations

import abc

import numpy as np
import torch

from yoco.forward_batch import ForwardBatch


class AttentionBackend(abc.ABC):
    @abc.abstractmethod
    def init_forward_metadata(self, fb: ForwardBatch) -> None: ...

    @abc.abstractmethod
    def init_forward_metadata_capture_cuda_graph(
        self, bs: int, req_slots: torch.Tensor, req_slots_np: np.ndarray, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor
    ) -> None: ...

    @abc.abstractmethod
    def init_forward_metadata_replay_cuda_graph(
        self,
        bs: int,
        req_slots: torch.Tensor,
        req_slots_np: np.ndarray,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        raw_bs: int,
    ) -> None: ...
