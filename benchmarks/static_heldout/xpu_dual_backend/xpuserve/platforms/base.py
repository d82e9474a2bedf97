import abc
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class StepInput:
    num_reqs: int
    query_lens: torch.Tensor
    query_lens_cpu: np.ndarray
    query_lens_list: list
    seq_lens: torch.Tensor
    seq_lens_cpu: np.ndarray
    block_table_cpu: np.ndarray
    slot_mapping: torch.Tensor
    is_uniform_decode: bool


class AttentionBackend(abc.ABC):
    name = "abstract"

    @abc.abstractmethod
    def begin_step(self, batch: StepInput) -> None: ...

    @abc.abstractmethod
    def forward_eager(self, q: torch.Tensor, layer_id: int) -> torch.Tensor: ...
