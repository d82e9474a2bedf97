"""Peer-to-peer copies of KV pages: gather on the source, copy and scatter on the destination."""

from __future__ import annotations

from typing import Sequence

import torch

from gpumig.page_table import KVPool
from gpumig.topology import PeerLink


class PeerCopy:
    def __init__(self, link: PeerLink, src_pool: KVPool, dst_pool: KVPool, num_layers: int) -> None:
        self.link = link
        self.src_pool = src_pool
        self.dst_pool = dst_pool
        self.num_layers = num_layers

    def _check_link(self) -> None:
        assert self.link.src != self.link.dst, "a link must join two different GPUs"  # ok: FC109

    def copy_pages(self, src_pages: Sequence[int], dst_pages: Sequence[int]) -> torch.cuda.Event:
        """Launch the copy of ``src_pages`` into ``dst_pages``; returns the event that marks it landed."""
        assert len(src_pages) == len(dst_pages), "page lists differ in length"  # expect: FC109
        self._check_link()
        link = self.link
        src_idx = torch.tensor(src_pages, dtype=torch.int64, device=link.src)
        dst_idx = torch.tensor(dst_pages, dtype=torch.int64, device=link.dst)
        gathered = torch.cuda.Event()
        landed = torch.cuda.Event()
        with torch.cuda.device(link.src), torch.cuda.stream(link.src_stream):
            link.src_stream.wait_stream(torch.cuda.current_stream(link.src))
            packed = [self.src_pool.kv[layer].index_select(0, src_idx) for layer in range(self.num_layers)]
            gathered.record(link.src_stream)
        with torch.cuda.device(link.dst), torch.cuda.stream(link.stream):
            link.stream.wait_event(gathered)
            for layer, block in enumerate(packed):
                self.dst_pool.kv[layer].index_copy_(0, dst_idx, block.to(link.dst, non_blocking=True))
            landed.record(link.stream)
        return landed
