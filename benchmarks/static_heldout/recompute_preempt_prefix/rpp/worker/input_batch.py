"""Persistent batch: one row per running request, numpy/pinned host state plus the
device copies the kernels read."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class CachedRequestState:
    req_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)


class InputBatch:
    def __init__(self, max_num_reqs: int, max_model_len: int, max_blocks_per_req: int, device: torch.device):
        self.max_num_reqs = max_num_reqs
        self.max_blocks = max_blocks_per_req
        self.device = device
        self.req_ids: list[str | None] = [None] * max_num_reqs
        self.req_id_to_index: dict[str, int] = {}
        self.num_reqs = 0

        self.token_ids_np = np.zeros((max_num_reqs, max_model_len), dtype=np.int32)
        self.num_tokens_np = np.zeros(max_num_reqs, dtype=np.int32)
        self.num_computed_tokens_cpu_tensor = torch.zeros(max_num_reqs, dtype=torch.int32, pin_memory=True)
        self.num_computed_tokens_np = self.num_computed_tokens_cpu_tensor.numpy()
        # the device copy feeds the position kernels of the eager path
        self.num_computed_gpu = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)
        self.resumed_np = np.zeros(max_num_reqs, dtype=bool)

        self.block_table = torch.zeros(max_num_reqs, max_blocks_per_req, dtype=torch.int32, device=device)
        self.block_table_cpu = torch.zeros(max_num_reqs, max_blocks_per_req, dtype=torch.int32, pin_memory=True)
        self.block_table_np = self.block_table_cpu.numpy()
        self.num_blocks_per_row = np.zeros(max_num_reqs, dtype=np.int32)

    def add_request(self, state: CachedRequestState) -> int:
        row = self.num_reqs
        self.num_reqs += 1
        self.req_ids[row] = state.req_id
        self.req_id_to_index[state.req_id] = row
        toks = state.prompt_token_ids + state.output_token_ids
        self.token_ids_np[row, : len(toks)] = toks
        self.num_tokens_np[row] = len(toks)
        self.num_computed_tokens_np[row] = state.num_computed_tokens
        self.block_table_np[row, : len(state.block_ids)] = state.block_ids
        self.num_blocks_per_row[row] = len(state.block_ids)
        return row

    def append_block_ids(self, row: int, block_ids: list[int]) -> None:
        start = self.num_blocks_per_row[row]
        self.block_table_np[row, start: start + len(block_ids)] = block_ids
        self.num_blocks_per_row[row] = start + len(block_ids)

    def append_token(self, row: int, token: int) -> None:
        self.token_ids_np[row, self.num_tokens_np[row]] = token
        self.num_tokens_np[row] += 1

    def remove_request(self, req_id: str) -> None:
        row = self.req_id_to_index.pop(req_id, None)
        if row is None:
            return
        last = self.num_reqs - 1
        if row != last:
            self._move_row(last, row)
        self.req_ids[last] = None
        self.num_reqs -= 1

    def _move_row(self, src: int, dst: int) -> None:
        rid = self.req_ids[src]
        self.req_ids[dst] = rid
        self.req_id_to_index[rid] = dst
        n = self.num_tokens_np[src]
        self.token_ids_np[dst, :n] = self.token_ids_np[src, :n]
        self.num_tokens_np[dst] = n
        self.num_computed_tokens_np[dst] = self.num_computed_tokens_np[src]
        self.block_table_np[dst] = self.block_table_np[src]
        self.num_blocks_per_row[dst] = self.num_blocks_per_row[src]
        self.resumed_np[dst] = self.resumed_np[src]

    def swap_rows(self, a: int, b: int) -> None:
        ra, rb = self.req_ids[a], self.req_ids[b]
        self.req_ids[a], self.req_ids[b] = rb, ra
        self.req_id_to_index[ra], self.req_id_to_index[rb] = b, a
        for arr in (self.token_ids_np, self.block_table_np):
            arr[[a, b]] = arr[[b, a]]
        for arr in (self.num_tokens_np, self.num_computed_tokens_np, self.num_blocks_per_row, self.resumed_np):
            arr[a], arr[b] = arr[b], arr[a]

    def reorder_decodes_first(self, num_scheduled: dict[str, int]) -> int:
        """Move single-token rows to the front; returns the number of decodes."""
        front = 0
        for row in range(self.num_reqs):
            if num_scheduled[self.req_ids[row]] == 1:
                if row != front:
                    self.swap_rows(row, front)
                front += 1
        return front

    def commit(self) -> None:
        n = self.num_reqs
        self.block_table[:n].copy_(self.block_table_cpu[:n], non_blocking=True)
        self.num_computed_gpu[:n].copy_(self.num_computed_tokens_cpu_tensor[:n], non_blocking=True)
