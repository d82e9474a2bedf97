"""Requests and what the scheduler hands the engine each step (host data only)."""

from dataclasses import dataclass, field
from typing import List, Tuple

import numpy as np


@dataclass
class Request:
    req_id: int
    prompt_ids: List[int]
    max_new_tokens: int
    output_ids: List[int] = field(default_factory=list)
    num_computed: int = 0
    pages: List[int] = field(default_factory=list)

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < len(self.prompt_ids)

    @property
    def seq_len(self) -> int:
        return self.num_computed + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return len(self.output_ids) >= self.max_new_tokens


@dataclass
class SchedulerOutput:
    """Decodes first, then prefill pieces; arrays indexed by row or token."""

    decode_reqs: List[Request]
    prefill_pieces: List[Tuple[Request, int, int]]
    num_tokens: int
    input_ids_np: np.ndarray
    positions_np: np.ndarray
    token_kind_np: np.ndarray
    logits_rows_np: np.ndarray
    qo_indptr_np: np.ndarray
    kv_indptr_np: np.ndarray
    kv_indices_np: np.ndarray
    last_page_len_np: np.ndarray
    block_tables_np: np.ndarray
    seq_lens_np: np.ndarray
    sampled_rows: List[Request]

    @property
    def num_decodes(self) -> int:
        return len(self.decode_reqs)

    @property
    def num_prefills(self) -> int:
        return len(self.prefill_pieces)

    @property
    def decode_only(self) -> bool:
        return not self.prefill_pieces
