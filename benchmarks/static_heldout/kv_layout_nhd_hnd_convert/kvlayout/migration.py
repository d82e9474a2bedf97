"""Promotion of long requests from the NHD pool to the HND pool, a few pages per step.

The pages are converted while the request keeps decoding in NHD; once every page has landed the
request switches to HND, and the pages it filled meanwhile stay behind as an NHD tail for a while.
"""

import collections
from dataclasses import dataclass, field

import numpy as np
import torch

from kvlayout.config import ServerConfig
from kvlayout.convert import convert_pages
from kvlayout.layouts import KVLayout
from kvlayout.pool import LayoutKVPool


@dataclass
class MigrationTicket:
    rid: int
    src_pages: torch.Tensor
    dst_pages: list
    seq_len_dev: torch.Tensor
    src_layout: KVLayout
    done: int = 0


@dataclass
class Landed:
    rid: int
    pages: list
    seq_len: int
    tail_from: int = 0
    extra: dict = field(default_factory=dict)


class Migrator:
    def __init__(self, cfg: ServerConfig, pools: dict, device):
        self.cfg = cfg
        self.src_pool: LayoutKVPool = pools[KVLayout.NHD]
        self.pool: LayoutKVPool = pools[KVLayout.HND]
        self.device = device
        self.pending = collections.deque()
        self.landed = []
        self.staging_ids = None

    def promote(self, rid: int, src_pages: list, seq_len_dev):
        dst = self.pool.alloc(len(src_pages))
        ids = torch.tensor(src_pages, dtype=torch.int64).to(self.device, non_blocking=True)
        self.pending.append(
            MigrationTicket(rid=rid, src_pages=ids, dst_pages=dst, seq_len_dev=seq_len_dev, src_layout=KVLayout.NHD)
        )

    def land_pending(self) -> int:
        """Moves this step's share of pages; runs while the step's metadata is prepared."""
        budget = self.cfg.migrate_pages_per_step
        if self.staging_ids is None:
            self.staging_ids = torch.empty(budget, dtype=torch.int64, device=self.device)  # ok: FC107
        moved = 0
        while self.pending and moved < budget:
            t = self.pending[0]
            n = min(budget - moved, len(t.dst_pages) - t.done)
            dst_host = torch.tensor(t.dst_pages[t.done : t.done + n], dtype=torch.int64, pin_memory=True)
            self.staging_ids[:n].copy_(dst_host, non_blocking=True)
            src = t.src_pages[t.done : t.done + n]
            for layer in range(self.cfg.num_layers):
                convert_pages(
                    self.src_pool.caches[layer], self.pool.caches[layer], src, self.staging_ids[:n], t.src_layout, self.pool.layout
                )
            t.done += n
            moved += n
            if t.done == len(t.dst_pages):
                self.pending.popleft()
                seq_len = t.seq_len_dev.item()  # expect: FC101
                self._register(t.rid, t.dst_pages)
                self.landed.append(Landed(rid=t.rid, pages=t.dst_pages, seq_len=seq_len, tail_from=len(t.dst_pages)))
        return moved

    def _register(self, rid: int, pages: list):
        row = self.pool.assign_row(rid)
        table = self.pool.req_to_page
        if row >= table.shape[0]:
            extra = torch.zeros(row + 1 - table.shape[0], table.shape[1], dtype=torch.int32, device=self.device)
            self.pool.req_to_page = torch.cat([table, extra])  # expect: FC107
            grown = np.zeros((row + 1, table.shape[1]), dtype=np.int32)
            grown[: self.pool.req_to_page_np.shape[0]] = self.pool.req_to_page_np
            self.pool.req_to_page_np = grown
        self.pool.req_to_page_np[row, : len(pages)] = pages
        self.pool.req_to_page[row, : len(pages)] = torch.from_numpy(self.pool.req_to_page_np[row, : len(pages)]).to(
            self.device, non_blocking=True
        )

    def drain_landed(self) -> list:
        out, self.landed = self.landed, []
        return out
