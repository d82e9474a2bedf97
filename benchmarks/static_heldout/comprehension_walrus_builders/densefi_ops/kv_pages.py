"""Page-list kernels written with torch ops: sliding-window page lists and KV compaction remaps.

Both run on the device without reading anything back: every size is either a Python int the caller knows
or a tensor that stays on the GPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from densefi.attention import FlashInferBackend


def window_page_indices(
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    indptr: torch.Tensor,
    *,
    window: int,
    page_size: int,
    out: torch.Tensor,
) -> None:
    """Fill `indptr` and `out` with the pages the last `window` tokens of each request live on."""
    max_pages = -(-window // page_size) + 1
    num_pages = (seq_lens + page_size - 1) // page_size
    count = torch.clamp(num_pages, max=max_pages)
    indptr[:1].zero_()
    torch.cumsum(count, 0, dtype=indptr.dtype, out=indptr[1:])
    j = torch.arange(max_pages, device=block_table.device)
    first = (num_pages - count)[:, None]
    cols = torch.minimum(first + j, (num_pages - 1).clamp(min=0)[:, None])
    pages = torch.gather(block_table, 1, cols.long())
    pos = indptr[:-1, None].long() + j
    # rows shorter than max_pages scatter their tail into the spare last slot of `out`
    pos = torch.where(j < count[:, None], pos, torch.full_like(pos, out.numel() - 1))
    out.scatter_(0, pos.reshape(-1), pages.reshape(-1).to(out.dtype))  # ok: FC104


def remap_block_ids(backend: "FlashInferBackend", remap: torch.Tensor) -> int:
    """Apply a compaction's old->new page map to the device page lists of every full-attention group."""
    moved = 0
    for _, idx in backend.kv_indices_gpu.items():
        idx.copy_(remap[idx.long()])  # expect: FC104
        moved += idx.numel()
    return moved


def compaction_plan(free_pages: list[int], used_pages: list[int]) -> dict[int, int]:
    """Host-side: move the highest used pages into the lowest free ones (a dict old -> new)."""
    movable = sorted((p for p in used_pages if free_pages and p > min(free_pages)), reverse=True)
    return dict(zip(movable, sorted(free_pages)))


def remap_table(plan: dict[int, int], num_pages: int) -> torch.Tensor:
    """The dense old->new page table a compaction plan stands for (identity outside the plan)."""
    table = torch.arange(num_pages, dtype=torch.int32)
    if plan:
        src, dst = map(list, zip(*plan.items()))
        table[torch.tensor(src)] = torch.tensor(dst, dtype=torch.int32)
    return table
