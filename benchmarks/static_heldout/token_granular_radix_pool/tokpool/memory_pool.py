"""Two-level memory: ``ReqToTokenPool`` maps a request slot to its token positions,
``TokenToKVPool`` owns the KV storage with one token per page."""

from __future__ import annotations

import abc
from typing import List, Optional, Tuple, Union

import torch


class ReqToTokenPool:
    def __init__(self, size: int, max_context_len: int, device: torch.device):
        self.size = size
        self.max_context_len = max_context_len
        self.device = device
        self.req_to_token = torch.zeros((size, max_context_len), dtype=torch.int32, device=device)
        self.free_slots: List[int] = list(range(size))

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self, need_size: int) -> Optional[List[int]]:
        if need_size > len(self.free_slots):
            return None
        select, self.free_slots = self.free_slots[:need_size], self.free_slots[need_size:]
        return select

    def free(self, free_index: Union[int, List[int]]) -> None:
        if isinstance(free_index, int):
            self.free_slots.append(free_index)
        else:
            self.free_slots.extend(free_index)

    def write(self, indices: Tuple[int, slice], values: torch.Tensor) -> None:
        assert values.shape[-1] <= self.max_context_len, "write past the request's context"  # expect: FC109
        self.req_to_token[indices] = values.to(torch.int32)


class BaseTokenToKVPool(abc.ABC):
    """Free slots are a stack on the device; ``free_top`` (host) is how many are free.
    Slot 0 is the padding slot that dummy rows write to and is never handed out."""

    def __init__(self, size: int, dtype: torch.dtype, device: torch.device):
        self.size = size
        self.dtype = dtype
        self.device = device
        self.page_size = 1
        self._kv_layout = "NHD"
        self.clear()

    def clear(self) -> None:
        self.stack = torch.arange(1, self.size + 1, dtype=torch.int64, device=self.device)
        self.free_top = self.size

    def available_size(self) -> int:
        return self.free_top

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        if need_size > self.free_top:
            return None
        self.free_top -= need_size
        return self.stack[self.free_top : self.free_top + need_size].clone()

    def free(self, free_index: torch.Tensor) -> None:
        n = free_index.numel()
        if n == 0:
            return
        if torch.isin(free_index, self.stack[: self.free_top]).any():  # expect: FC101
            raise RuntimeError("double free of KV slots")
        self.stack[self.free_top : self.free_top + n].copy_(free_index)
        self.free_top += n

    @abc.abstractmethod
    def get_kv_buffer(self, layer_id: int) -> Tuple[torch.Tensor, torch.Tensor]: ...

    @abc.abstractmethod
    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None: ...

    @abc.abstractmethod
    def move_slots(self, dst: torch.Tensor) -> None: ...

    def compact(self) -> torch.Tensor:
        """Renumber the used slots densely from 1 (the gather kernels read contiguous slots
        after long runs of evictions); returns the old -> new map, on the device."""
        is_free = torch.zeros(self.size + 1, dtype=torch.bool, device=self.device)
        is_free[self.stack[: self.free_top]] = True
        is_free[0] = True
        used = ~is_free
        remap = torch.cumsum(used.to(torch.int64), 0) * used
        self.move_slots(remap)
        n_used = self.size - self.free_top
        self.stack[: self.free_top].copy_(torch.arange(n_used + 1, self.size + 1, device=self.device))
        return remap


class MHATokenToKVPool(BaseTokenToKVPool):
    def __init__(
        self, size: int, dtype: torch.dtype, head_num: int, head_dim: int, layer_num: int, device: torch.device
    ):
        super().__init__(size, dtype, device)
        self.head_num = head_num
        self.head_dim = head_dim
        self.k_buffer = [torch.zeros((size + 1, head_num, head_dim), dtype=dtype, device=device) for _ in range(layer_num)]
        self.v_buffer = [torch.zeros((size + 1, head_num, head_dim), dtype=dtype, device=device) for _ in range(layer_num)]

    def get_kv_buffer(self, layer_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffer[layer_id], self.v_buffer[layer_id]

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k_buffer[layer_id][loc] = k.to(self.dtype)
        self.v_buffer[layer_id][loc] = v.to(self.dtype)

    def move_slots(self, dst: torch.Tensor) -> None:
        for k, v in zip(self.k_buffer, self.v_buffer):
            k.index_copy_(0, dst, k.clone())
            v.index_copy_(0, dst, v.clone())
