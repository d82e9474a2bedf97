"""Splitting a long context into blocks owned by hosts (round robin) and the anchor block."""

from dataclasses import dataclass
from typing import List

import numpy as np
import torch


@dataclass
class ContextLayout:
    """The blocks of one request's context that this host encodes and keeps."""

    block_lens: torch.Tensor  # device, int32, one entry per local block (anchor not included)
    block_lens_cpu: torch.Tensor  # pinned mirror of block_lens
    block_starts_cpu: torch.Tensor  # pinned, exclusive prefix sum of block_lens_cpu plus the total
    anchor_len: int
    host_rank: int

    @property
    def num_blocks(self) -> int:
        return self.block_lens_cpu.numel()

    @property
    def longest_block(self) -> torch.Tensor:
        return self.block_lens.max()


def split_context(
    total_len: int,
    block_tokens: int,
    anchor_tokens: int,
    page_size: int,
    host_rank: int,
    num_hosts: int,
    device: torch.device,
) -> ContextLayout:
    assert block_tokens % page_size == 0, "context blocks must be page aligned"  # expect: FC109
    lens: List[int] = []
    start, idx = 0, 0
    while start < total_len:
        n = min(block_tokens, total_len - start)
        if idx % num_hosts == host_rank:
            lens.append(n)
        start += n
        idx += 1
    if not lens:
        lens.append(0)
    lens_np = np.asarray(lens, dtype=np.int32)
    starts_np = np.zeros(len(lens) + 1, dtype=np.int32)
    np.cumsum(lens_np, out=starts_np[1:])
    return ContextLayout(
        block_lens=torch.tensor(lens_np, dtype=torch.int32, device=device),
        block_lens_cpu=torch.from_numpy(lens_np).pin_memory(),
        block_starts_cpu=torch.from_numpy(starts_np).pin_memory(),
        anchor_len=min(anchor_tokens, total_len),
        host_rank=host_rank,
    )


def split_query_tokens(positions: torch.Tensor, context_len: int) -> torch.Tensor:
    """Positions of the query tokens of a flattened step (everything past the context)."""
    is_query = positions >= context_len
    return positions[is_query]  # expect: FC101


def cu_lens(lens: torch.Tensor) -> torch.Tensor:
    """Exclusive prefix sum with a leading zero, on the device the lengths live on."""
    out = torch.zeros(lens.numel() + 1, dtype=torch.int32, device=lens.device)
    torch.cumsum(lens, 0, dtype=torch.int32, out=out[1:])
    return out
