from dataclasses import dataclass, field
from typing import List

import numpy as np


@dataclass
class LogprobRequest:
    req_id: int
    prompt_ids: np.ndarray
    top_k: int
    pages: List[int] = field(default_factory=list)
    num_computed: int = 0
    prompt_logprobs: List[float] = field(default_factory=list)
    prompt_ranks: List[int] = field(default_factory=list)
    prompt_top_ids: List[List[int]] = field(default_factory=list)
    output_ids: List[int] = field(default_factory=list)

    @property
    def remaining(self) -> int:
        return len(self.prompt_ids) - self.num_computed

    @property
    def seq_len(self) -> int:
        return self.num_computed + len(self.output_ids)


@dataclass
class ChunkPlan:
    req_ids: List[int]
    input_ids_np: np.ndarray
    positions_np: np.ndarray
    extend_lens_np: np.ndarray
    prefix_lens_np: np.ndarray
    page_table_np: np.ndarray
    # the next prompt token for every position of the chunk, -1 past the end of the prompt
    target_ids_np: np.ndarray
    finishes_prompt: List[bool]
