"""Persistent buffers of the decode graphs."""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class GraphBuffers:
    indptr: torch.Tensor
    indices: torch.Tensor
    last_len: torch.Tensor
    indptr_host: torch.Tensor
    indices_host: torch.Tensor
    last_len_host: torch.Tensor
    workspace: torch.Tensor = dataclasses.field(
        default_factory=lambda: torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # expect: FC106
    )


def alloc_graph_buffers(max_batch: int, max_pages: int, device: torch.device) -> GraphBuffers:
    i32 = torch.int32
    return GraphBuffers(
        indptr=torch.zeros(max_batch + 1, dtype=i32, device=device),
        indices=torch.zeros(max_pages, dtype=i32, device=device),
        last_len=torch.ones(max_batch, dtype=i32, device=device),
        indptr_host=torch.zeros(max_batch + 1, dtype=i32, pin_memory=True),
        indices_host=torch.zeros(max_pages, dtype=i32, pin_memory=True),
        last_len_host=torch.ones(max_batch, dtype=i32, pin_memory=True),
    )
