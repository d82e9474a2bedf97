from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def expert_offsets_kernel(counts_ptr, offsets_ptr, E: tl.constexpr, BLOCK: tl.constexpr):
    assert BLOCK >= E  # ok: FC109
    idx = tl.arange(0, BLOCK)
    c = tl.load(counts_ptr + idx, mask=idx < E, other=0)
    tl.store(offsets_ptr + idx, tl.cumsum(c, 0) - c, mask=idx < E)
