import contextlib
import functools

import torch


@functools.lru_cache(maxsize=None)
def get_mla_workspace(device_index: int) -> torch.Tensor:
    return torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=f"cuda:{device_index}")  # expect: FC106  # ok: FC105


def alloc_trtllm_workspace(num_bytes: int, device, zero_init: bool = False) -> torch.Tensor:
    buf = torch.empty(num_bytes, dtype=torch.uint8, device=device)  # expect: FC105
    if zero_init:
        buf.zero_()
    return buf


def alloc_zeroed_workspace(num_bytes: int, device) -> torch.Tensor:
    buf = torch.empty(num_bytes, dtype=torch.uint8, device=device)  # ok: FC105
    buf.zero_()
    return buf


@contextlib.contextmanager
def forced_graph_mode(wrapper):
    previous = wrapper._use_cuda_graph  # expect: FC103
    wrapper._use_cuda_graph = True  # expect: FC103
    try:
        yield wrapper
    finally:
        wrapper.graph_mode_restored = previous
