"""Page tables of the two KV pools: the full pool (retrieval heads) and the sink + window pool."""

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class RazorBatch:
    batch_size: int
    input_ids: torch.Tensor  # device
    positions: torch.Tensor  # device
    seq_lens: torch.Tensor  # device
    seq_lens_cpu: np.ndarray
    full_indices: torch.Tensor  # device, packed full-pool pages of each request
    full_page_counts_cpu: np.ndarray
    slot_table: torch.Tensor  # device, [bs, sink + window] compressed-pool slots owned by each request


@dataclass
class CompressedPageTable:
    kv_indptr: torch.Tensor
    packed: torch.Tensor
    last_page_len: torch.Tensor


@torch.jit.script
def window_start(seq_lens: torch.Tensor, window: int, sink: int) -> torch.Tensor:
    assert window > 0  # ok: FC109
    return torch.clamp(seq_lens - window, min=sink)


def compressed_page_table(slot_table: torch.Tensor, seq_lens: torch.Tensor, sink_pages: int, window_pages: int,
                          page_size: int) -> CompressedPageTable:
    """Sink pages, then the window ring rotated so that the page being written comes last (no host sync)."""
    d = seq_lens.device
    width = sink_pages + window_pages
    num_pages = (seq_lens + page_size - 1) // page_size
    kept = torch.clamp(num_pages, max=width)
    indptr = torch.zeros(seq_lens.numel() + 1, dtype=torch.int32, device=d)
    torch.cumsum(kept, 0, dtype=torch.int32, out=indptr[1:])
    first = window_start(seq_lens, window_pages * page_size, sink_pages * page_size) // page_size
    head = (first - sink_pages) % window_pages
    ring = (head.unsqueeze(1) + torch.arange(window_pages, device=d)) % window_pages
    sink = torch.arange(sink_pages, device=d).expand(seq_lens.numel(), -1)
    rows = torch.gather(slot_table, 1, torch.cat([sink, sink_pages + ring], dim=1))
    j = torch.arange(width, device=d)
    trash = rows.numel()
    pos = torch.where(j < kept.unsqueeze(1), indptr[:-1].unsqueeze(1).long() + j, torch.full_like(j, trash))
    packed = torch.zeros(trash + 1, dtype=torch.int32, device=d)
    packed.scatter_(0, pos.flatten(), rows.flatten().int())
    last = ((seq_lens - 1) % page_size + 1).int()
    return CompressedPageTable(kv_indptr=indptr, packed=packed, last_page_len=last)
