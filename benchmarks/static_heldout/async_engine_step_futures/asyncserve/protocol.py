"""What travels between the scheduler, the metadata thread and the GPU worker."""

import asyncio
from dataclasses import dataclass, field
from typing import Any, Optional

import torch


@dataclass
class Request:
    rid: int
    prompt: list
    max_new_tokens: int
    done: asyncio.Future
    page_ids: list = field(default_factory=list)
    out_tokens: list = field(default_factory=list)
    computed: int = 0

    @property
    def seq_len(self) -> int:
        return len(self.prompt) + len(self.out_tokens)


@dataclass
class ScheduledBatch:
    step_id: int
    reqs: list
    is_decode: bool


@dataclass
class HostStepMeta:
    """Built on the metadata thread from pinned buffers and numpy only."""

    step_id: int
    req_ids: list
    bs: int
    rows: int
    is_decode: bool
    num_tokens: int
    graph_bs: Optional[int]
    max_seq_len: int
    use_trtllm: bool
    input_ids_pinned: torch.Tensor
    positions_pinned: torch.Tensor
    seq_lens_pinned: torch.Tensor
    extend_lens_pinned: torch.Tensor
    prev_rows_pinned: torch.Tensor
    kv_indptr_pinned: torch.Tensor
    kv_indices_pinned: torch.Tensor
    last_page_pinned: torch.Tensor
    qo_indptr_pinned: torch.Tensor
    chunk_indptr_pinned: torch.Tensor
    chunk_indices_pinned: torch.Tensor
    chunk_last_page_pinned: torch.Tensor
    append_slots_pinned: torch.Tensor
    append_pages_pinned: torch.Tensor
    write_pages_pinned: torch.Tensor
    write_offsets_pinned: torch.Tensor


@dataclass
class DevicePlan:
    bs: int
    graph_bs: Optional[int]
    is_decode: bool
    num_tokens: int
    max_seq_len: int
    use_trtllm: bool
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens_dev: torch.Tensor
    extend_lens_dev: torch.Tensor
    kv_indptr_dev: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices_dev: torch.Tensor
    kv_indices_cpu: torch.Tensor
    last_page_cpu: torch.Tensor
    qo_indptr_dev: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    chunk_indptr_cpu: torch.Tensor
    chunk_indices_dev: torch.Tensor
    chunk_last_page_cpu: torch.Tensor
    append_slots_dev: torch.Tensor
    append_pages_dev: torch.Tensor
    write_pages: torch.Tensor
    write_offsets: torch.Tensor
    block_tables_dev: Optional[torch.Tensor] = None
    sample_scratch: Optional[torch.Tensor] = None


@dataclass
class StepResult:
    step_id: int
    req_ids: list
    bs: int
    next_tokens: torch.Tensor
    finished: torch.Tensor
    tokens_pinned: torch.Tensor
    copy_done: Any
    stop_rows: list = field(default_factory=list)
