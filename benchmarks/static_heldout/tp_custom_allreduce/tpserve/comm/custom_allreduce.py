"""One-shot / two-shot all-reduce over CUDA IPC buffers, usable inside CUDA graphs (vLLM-style).

Eagerly, inputs are copied into a pre-registered IPC buffer.  Inside a graph capture the kernel reads the
input where it lies; the addresses of those inputs are only known after capture, so ``capture()`` gathers the
graph buffers' IPC handles of every rank when it exits and registers them with the extension.
"""

from __future__ import annotations

import contextlib
from typing import List, Optional

import torch
import torch.distributed as dist

from tpserve._ext import custom_ar as ops  # C++/CUDA extension built with the package

_MAX_CAR_SIZE = 8 * 1024 * 1024
_SUPPORTED_WORLD_SIZES = (2, 4, 6, 8)
_SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

_TP_GROUP: Optional[dist.ProcessGroup] = None
_CA_COMM: Optional["CustomAllreduce"] = None


def init_tp_group(ranks: List[int]) -> dist.ProcessGroup:
    global _TP_GROUP
    _TP_GROUP = dist.new_group(ranks, backend="nccl")
    return _TP_GROUP


def get_tp_group() -> dist.ProcessGroup:
    if _TP_GROUP is None:
        raise RuntimeError("tensor-parallel group is not initialized; call init_tp_group() first")
    return _TP_GROUP


def init_custom_allreduce(device: torch.device, disable: bool = False) -> Optional["CustomAllreduce"]:
    global _CA_COMM
    if not disable:
        _CA_COMM = CustomAllreduce(get_tp_group(), device)
    return _CA_COMM


class CustomAllreduce:
    def __init__(self, group: dist.ProcessGroup, device: torch.device, max_size: int = _MAX_CAR_SIZE) -> None:
        assert max_size % 16 == 0, "max_size must be a multiple of 16 bytes"  # expect: FC109
        self.group = group
        self.device = device
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.max_size = max_size
        self._IS_CAPTURING = False
        self.disabled = self.world_size not in _SUPPORTED_WORLD_SIZES
        if self.disabled:
            return
        self.meta_ptrs = self.create_shared_buffer(self._meta_bytes() + max_size)
        self.buffer_ptrs = self.create_shared_buffer(max_size)
        # scratch where the extension keeps the rank pointers of every registered buffer
        self.rank_data = torch.empty(8 * 1024 * 1024, dtype=torch.uint8, device=device)
        self._ptr = ops.init_custom_ar(self.meta_ptrs, self.rank_data, self.rank, True)
        ops.register_buffer(self._ptr, self.buffer_ptrs)

    def _meta_bytes(self) -> int:
        n = ops.meta_size()
        assert n % 16 == 0, "extension reports a misaligned signal block"  # ok: FC109
        return n

    def create_shared_buffer(self, size: int) -> List[int]:
        ptr, handle = ops.allocate_shared_buffer_and_handle(size)
        handles: List[object] = [None] * self.world_size
        dist.all_gather_object(handles, handle, group=self.group)
        return [ptr if i == self.rank else ops.open_mem_handle(h) for i, h in enumerate(handles)]

    @contextlib.contextmanager
    def capture(self):
        """Wrap every CUDA-graph capture that may all-reduce; registers the graph buffers on exit."""
        try:
            self._IS_CAPTURING = True
            yield
        finally:
            self._IS_CAPTURING = False
            if not self.disabled:
                self.register_graph_buffers()

    def register_graph_buffers(self) -> None:
        handle, offsets = ops.get_graph_buffer_ipc_meta(self._ptr)
        everyone: List[object] = [None] * self.world_size
        dist.all_gather_object(everyone, (handle, offsets), group=self.group)
        ops.register_graph_buffers(self._ptr, [e[0] for e in everyone], [e[1] for e in everyone])

    def should_custom_ar(self, inp: torch.Tensor) -> bool:
        if self.disabled:
            return False
        nbytes = inp.numel() * inp.element_size()
        return nbytes % 16 == 0 and inp.is_contiguous() and nbytes < self.max_size

    def all_reduce(self, inp: torch.Tensor, *, out: Optional[torch.Tensor] = None, registered: bool = False):
        assert inp.dtype in _SUPPORTED_DTYPES, "custom all-reduce supports fp16, bf16 and fp32"  # expect: FC109
        if out is None:
            out = torch.empty_like(inp)
        if registered:
            ops.all_reduce(self._ptr, inp, out, 0, 0)
        else:
            ops.all_reduce(self._ptr, inp, out, self.buffer_ptrs[self.rank], self.max_size)
        return out

    def custom_all_reduce(self, inp: torch.Tensor) -> Optional[torch.Tensor]:
        if not self.should_custom_ar(inp):
            return None
        if self._IS_CAPTURING:
            if torch.cuda.is_current_stream_capturing():
                return self.all_reduce(inp, registered=True)
            return torch.empty_like(inp)  # warm-up run before the capture: only the shape matters
        return self.all_reduce(inp, registered=False)

    def close(self) -> None:
        assert not self._IS_CAPTURING, "close() called inside a graph capture"  # ok: FC109
        if not self.disabled:
            ops.dispose(self._ptr)
            self.disabled = True


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    if _CA_COMM is not None:
        out = _CA_COMM.custom_all_reduce(x)
        if out is not None:
            return out
    dist.all_reduce(x, group=get_tp_group())
    return x
