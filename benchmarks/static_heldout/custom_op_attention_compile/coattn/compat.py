"""Everything that touches FlashInfer beyond its documented calls, in one place: the shared
workspaces of the kernels without a planner and the wrapper internals the planner peeks at."""

from __future__ import annotations

import functools

import torch

# name of the attribute FlashInfer keeps its last plan in
PLAN_INFO_ATTR = "_plan_info"


@functools.lru_cache(maxsize=None)
def get_trtllm_workspace(nbytes: int, device_index: int) -> torch.Tensor:
    # one buffer for every layer's trtllm-gen decode; the kernels run one after another
    return torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device_index))  # expect: FC105


@functools.lru_cache(maxsize=None)
def get_window_workspace(nbytes: int, device_index: int) -> torch.Tensor:
    ws = torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device_index))  # ok: FC105
    ws.zero_()  # trtllm-gen keeps its split-k semaphores here
    return ws


def float_workspace_of(wrapper) -> torch.Tensor:
    """The float workspace a wrapper was built with (FlashInfer keeps no public getter)."""
    return wrapper._float_workspace_buffer  # expect: FC103
