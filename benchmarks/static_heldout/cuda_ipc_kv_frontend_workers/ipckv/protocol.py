"""Messages between the frontend and the workers (numpy only: they cross a process boundary)."""

from dataclasses import dataclass
from typing import List

import numpy as np


@dataclass
class StepMessage:
    step_id: int
    is_prefill: bool
    req_ids: List[int]
    input_ids_np: np.ndarray
    positions_np: np.ndarray
    seq_lens_np: np.ndarray
    qo_indptr_np: np.ndarray
    page_table_np: np.ndarray
    peer_page_table_np: np.ndarray
    peer_lens_np: np.ndarray
    epochs_np: np.ndarray
    bucket: int = 0


@dataclass
class StepResult:
    step_id: int
    worker: int
    event_handle: bytes
    num_tokens: int
