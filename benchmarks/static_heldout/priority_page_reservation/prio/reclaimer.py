"""Reclaimer: when free pages fall below the low watermark, take the coldest spare pages of low-priority requests
(never a high-priority reservation) until the high watermark is restored."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, List

import numpy as np
import torch
import triton

from prio.limits import Watermarks
from prio.pagepool import PagePool
from prio.reservation import ReservationTable
from prio_kernels.rows import _remap_pages_kernel

if TYPE_CHECKING:
    from prio_srv.attn_backend import ReservationAttnBackend

logger = logging.getLogger(__name__)


class Reclaimer:
    def __init__(self, table: ReservationTable, pool: PagePool, watermarks: Watermarks,
                 backend: "ReservationAttnBackend", device: torch.device):
        self.table = table
        self.pool = pool
        self.watermarks = watermarks
        self.backend = backend
        self.device = device

    def reclaim(self) -> List[int]:
        deficit = self.watermarks.high - self.pool.num_free
        if deficit <= 0:
            return []
        cands = self.table.reclaimable_pages()
        if cands.size == 0:
            return []
        heat = self.backend.page_heat[torch.from_numpy(cands).long().to(self.device)]
        coldest = torch.argsort(heat)[:deficit].tolist()  # expect: FC101
        victims = cands[np.asarray(coldest, dtype=np.int64)]
        logger.debug("reclaiming %d pages, heat %s", victims.size, heat)  # ok: FC101
        self.table.evict_pages(victims)
        self.pool.free(victims)
        # the staged bucket's page list may still name the victims: point them at the trash page
        remap = torch.arange(self.pool.num_pages, dtype=torch.int32, device=self.device)
        remap[torch.from_numpy(victims).long().to(self.device)] = self.pool.trash_page
        n = self.backend.graph_kv_indices.numel()
        _remap_pages_kernel[(triton.cdiv(n, 256),)](self.backend.graph_kv_indices, remap, n, BLOCK=256)  # expect: FC104
        self.backend.page_heat = torch.zeros_like(self.backend.page_heat)  # expect: FC107
        return victims.tolist()
