"""Copy-on-write page copies: one program per (copy, layer, block of the page)."""
from __future__ import annotations

from typing import List

import torch
import triton
import triton.language as tl


@triton.jit
def cow_copy_kernel(cache_ptrs, src_ptr, dst_ptr, page_numel, BLOCK: tl.constexpr):
    assert BLOCK % 128 == 0  # ok: FC109
    copy_id = tl.program_id(0)
    layer = tl.program_id(1)
    blk = tl.program_id(2)
    base = tl.load(cache_ptrs + layer).to(tl.pointer_type(tl.bfloat16))
    src = tl.load(src_ptr + copy_id).to(tl.int64)
    dst = tl.load(dst_ptr + copy_id).to(tl.int64)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < page_numel
    vals = tl.load(base + src * page_numel + offs, mask=mask)
    tl.store(base + dst * page_numel + offs, vals, mask=mask)


class PageCopier:
    def __init__(self, kv_cache: List[torch.Tensor], device: torch.device):
        self.page_numel = kv_cache[0][0].numel()
        self.num_layers = len(kv_cache)
        self.cache_ptrs = torch.tensor([t.data_ptr() for t in kv_cache], dtype=torch.int64, device=device)
        self.block = 1024

    def copy_pages(self, src: torch.Tensor, dst: torch.Tensor, n: int) -> None:
        grid = (n, self.num_layers, triton.cdiv(self.page_numel, self.block))
        cow_copy_kernel[grid](self.cache_ptrs, src, dst, self.page_numel, BLOCK=self.block)
