"""Persistent batch: per-request state kept across steps, device tensors with pinned numpy mirrors."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Dict, Generic, List, Optional, TypeVar

import numpy as np
import torch

T = TypeVar("T", np.int32, np.int64, np.float32)


class CpuGpuBuffer(Generic[T]):
    """A pinned host tensor, its numpy view and a device twin of the same shape."""

    def __init__(self, *size: int, dtype: torch.dtype, device: torch.device, pin_memory: bool = True):
        self.cpu = torch.zeros(*size, dtype=dtype, device="cpu", pin_memory=pin_memory)
        self.np = self.cpu.numpy()
        self.gpu = self.cpu.to(device)

    def copy_to_gpu(self, n: Optional[int] = None) -> torch.Tensor:
        if n is None:
            return self.gpu.copy_(self.cpu, non_blocking=True)
        return self.gpu[:n].copy_(self.cpu[:n], non_blocking=True)


@dataclass
class CachedRequestState:
    req_id: str
    prompt_token_ids: List[int]
    block_ids: List[int]
    num_computed_tokens: int
    output_token_ids: List[int] = field(default_factory=list)
    temperature: float = 1.0
    num_draft_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)


class BlockTable:
    def __init__(self, max_num_reqs: int, max_num_blocks_per_req: int, device: torch.device):
        self.block_table: CpuGpuBuffer[np.int32] = CpuGpuBuffer(max_num_reqs, max_num_blocks_per_req, dtype=torch.int32, device=device)
        self.num_blocks_per_row = np.zeros(max_num_reqs, dtype=np.int32)

    def add_row(self, block_ids: List[int], row: int) -> None:
        self.block_table.np[row, : len(block_ids)] = block_ids
        self.num_blocks_per_row[row] = len(block_ids)

    def append_row(self, block_ids: List[int], row: int) -> None:
        start = self.num_blocks_per_row[row]
        self.block_table.np[row, start : start + len(block_ids)] = block_ids
        self.num_blocks_per_row[row] += len(block_ids)

    def move_row(self, src: int, tgt: int) -> None:
        n = self.num_blocks_per_row[src]
        self.block_table.np[tgt, :n] = self.block_table.np[src, :n]
        self.num_blocks_per_row[tgt] = n

    def commit(self, num_reqs: int) -> torch.Tensor:
        return self.block_table.copy_to_gpu(num_reqs)


class InputBatch:
    def __init__(self, max_num_reqs: int, max_model_len: int, max_num_blocks_per_req: int, device: torch.device):
        self.max_num_reqs = max_num_reqs
        self.req_ids: List[Optional[str]] = [None] * max_num_reqs
        self.req_id_to_index: Dict[str, int] = {}
        self.token_ids_cpu = np.zeros((max_num_reqs, max_model_len), dtype=np.int32)
        self.num_tokens = np.zeros(max_num_reqs, dtype=np.int32)
        self.num_computed_tokens_cpu = np.zeros(max_num_reqs, dtype=np.int32)
        self.temperature: CpuGpuBuffer[np.float32] = CpuGpuBuffer(max_num_reqs, dtype=torch.float32, device=device)
        self.num_draft_tokens: CpuGpuBuffer[np.int32] = CpuGpuBuffer(max_num_reqs, dtype=torch.int32, device=device)
        self.block_table = BlockTable(max_num_reqs, max_num_blocks_per_req, device)
        self.all_greedy = True

    @property
    def num_reqs(self) -> int:
        return len(self.req_id_to_index)

    def add_request(self, request: CachedRequestState, req_index: Optional[int] = None) -> int:
        if req_index is None:
            req_index = self.num_reqs
        assert req_index < self.max_num_reqs, "persistent batch is full"  # expect: FC109
        self.req_ids[req_index] = request.req_id
        self.req_id_to_index[request.req_id] = req_index
        n_prompt = len(request.prompt_token_ids)
        self.token_ids_cpu[req_index, :n_prompt] = request.prompt_token_ids
        self.token_ids_cpu[req_index, n_prompt : request.num_tokens] = request.output_token_ids
        self.num_tokens[req_index] = request.num_tokens
        self.num_computed_tokens_cpu[req_index] = request.num_computed_tokens
        self.temperature.np[req_index] = request.temperature
        self.num_draft_tokens.np[req_index] = request.num_draft_tokens
        self.block_table.add_row(request.block_ids, req_index)
        return req_index

    def remove_request(self, req_id: str) -> Optional[int]:
        req_index = self.req_id_to_index.pop(req_id, None)
        if req_index is not None:
            self.req_ids[req_index] = None
        return req_index

    def _move(self, src: int, tgt: int) -> None:
        req_id = self.req_ids[src]
        self.req_ids[tgt], self.req_ids[src] = req_id, None
        self.req_id_to_index[req_id] = tgt
        n = self.num_tokens[src]
        self.token_ids_cpu[tgt, :n] = self.token_ids_cpu[src, :n]
        for arr in (self.num_tokens, self.num_computed_tokens_cpu, self.temperature.np, self.num_draft_tokens.np):
            arr[tgt] = arr[src]
        self.block_table.move_row(src, tgt)

    def condense(self, empty_req_indices: List[int]) -> None:
        """Move the last requests into the holes finished ones left, so rows [0, num_reqs) are dense."""
        last = self.num_reqs + len(empty_req_indices) - 1
        tails = [i for i in range(last, -1, -1) if self.req_ids[i] is not None]
        for hole, tail in itertools.zip_longest(sorted(empty_req_indices), tails):
            if hole is None or tail is None or tail <= hole:
                break
            self._move(tail, hole)

    def refresh_sampling_metadata(self) -> None:
        n = self.num_reqs
        self.temperature.copy_to_gpu(n)
        self.num_draft_tokens.copy_to_gpu(n)
        self.all_greedy = bool((self.temperature.np[:n] < 1e-5).all())  # ok: FC101
