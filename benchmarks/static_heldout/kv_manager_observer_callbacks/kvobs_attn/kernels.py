"""Triton page-remap kernel and the trtllm workspace cache of the attention backend."""
from typing import Dict, Tuple

import torch
import triton
import triton.language as tl

_TRTLLM_WS: Dict[Tuple[str, int], torch.Tensor] = {}


@triton.jit
def remap_pages_kernel(indices_ptr, remap_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    assert n >= 0  # ok: FC109
    old = tl.load(indices_ptr + offs, mask=offs < n)
    tl.store(indices_ptr + offs, tl.load(remap_ptr + old, mask=offs < n), mask=offs < n)


def remap_pages(indices: torch.Tensor, remap: torch.Tensor, n: int) -> None:
    """Rewrite page ids in place after a compaction (old page -> new page)."""
    remap_pages_kernel[(triton.cdiv(n, 1024),)](indices, remap, n, BLOCK=1024)


def trtllm_workspace(device: torch.device, nbytes: int) -> torch.Tensor:
    key = (str(device), nbytes)
    if key not in _TRTLLM_WS:
        _TRTLLM_WS[key] = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
    return _TRTLLM_WS[key]
