"""The persistent batch: request rows survive across steps; finished rows are filled by condensing from the end."""
from __future__ import annotations

from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch


class CpuGpuBuffer:  # a pinned host tensor, its numpy view and a device twin of the same shape
    def __init__(self, *size: int, dtype: torch.dtype, device: torch.device):
        self.cpu = torch.zeros(*size, dtype=dtype, pin_memory=True)
        self.np = self.cpu.numpy()
        self.gpu = torch.zeros(*size, dtype=dtype, device=device)

    def copy_to_gpu(self, n: int) -> torch.Tensor:
        return self.gpu[:n].copy_(self.cpu[:n], non_blocking=True)


class InputBatch:
    def __init__(self, max_num_reqs: int, max_model_len: int, max_blocks: int, device: torch.device):
        self.max_num_reqs = max_num_reqs
        self.req_ids: List[Optional[str]] = []
        self.req_id_to_index: Dict[str, int] = {}
        self.token_ids_cpu = np.zeros((max_num_reqs, max_model_len), dtype=np.int32)
        self.num_tokens = np.zeros(max_num_reqs, dtype=np.int32)
        self.num_computed_tokens = CpuGpuBuffer(max_num_reqs, dtype=torch.int32, device=device)
        self.block_table = CpuGpuBuffer(max_num_reqs, max_blocks, dtype=torch.int32, device=device)
        self.temperature = CpuGpuBuffer(max_num_reqs, dtype=torch.float32, device=device)
        # async scheduling: the row of each request in the previous step's sampled output (-1: none)
        self.prev_sampled_index = CpuGpuBuffer(max_num_reqs, dtype=torch.int64, device=device)
        self.prev_sampled_index.np.fill(-1)

    @property
    def num_reqs(self) -> int:
        return len(self.req_id_to_index)

    def add_request(self, req_id: str, prompt: List[int], block_ids: List[int], temperature: float,
                    req_index: Optional[int] = None) -> int:
        if req_index is None:
            req_index = len(self.req_ids)
            self.req_ids.append(req_id)
        else:
            self.req_ids[req_index] = req_id
        assert req_index < self.max_num_reqs, "persistent batch is full"  # expect: FC109
        self.req_id_to_index[req_id] = req_index
        self.token_ids_cpu[req_index, : len(prompt)] = prompt
        self.num_tokens[req_index] = len(prompt)
        self.num_computed_tokens.np[req_index] = 0
        self.block_table.np[req_index, : len(block_ids)] = block_ids
        self.temperature.np[req_index] = temperature
        self.prev_sampled_index.np[req_index] = -1
        return req_index

    def remove_request(self, req_id: str) -> Optional[int]:
        if (index := self.req_id_to_index.pop(req_id, None)) is not None:
            self.req_ids[index] = None
        return index

    def _moves(self, empty: List[int]) -> Iterator[Tuple[int, int]]:
        """Yield (last live row, first hole) pairs until no hole lies before a live row."""
        holes, last = sorted(empty), len(self.req_ids) - 1
        for hole in holes:
            while last > hole and self.req_ids[last] is None:
                last -= 1
            if last <= hole:
                return
            yield last, hole
            last -= 1

    def condense(self, empty_req_indices: List[int]) -> List[Tuple[int, int]]:
        moves = list(self._moves(empty_req_indices))
        rows = (self.token_ids_cpu, self.num_tokens, self.num_computed_tokens.np, self.block_table.np,
                self.temperature.np, self.prev_sampled_index.np)
        for src, dst in moves:
            req_id = self.req_ids[src]
            self.req_ids[dst], self.req_ids[src] = req_id, None
            self.req_id_to_index[req_id] = dst
            for arr in rows:
                arr[dst] = arr[src]
        del self.req_ids[self.num_reqs :]
        self._check_dense()
        return moves

    def _check_dense(self) -> None:
        assert all(r is not None for r in self.req_ids), "condense left a hole"  # ok: FC109
