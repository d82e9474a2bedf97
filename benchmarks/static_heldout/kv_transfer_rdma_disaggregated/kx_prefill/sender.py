"""Gathers a finished prompt's KV pages into the registered region and posts RDMA writes."""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from kvx import RegisteredRegion, TransferConfig, TransferManifest, Verbs


class PrefillSender:
    def __init__(self, cfg: TransferConfig, verbs: Verbs, region: RegisteredRegion, kv_cache_pages, device):
        self.cfg = cfg
        self.verbs = verbs
        self.region = region
        self.kv_cache_pages = kv_cache_pages  # [num_pages, page_numel] view of the paged cache
        self.device = device
        self.copy_stream = torch.cuda.Stream()
        self.gather_done = torch.cuda.Event()
        self.gather_buf: Optional[torch.Tensor] = None
        self.qp = -1
        self.qp_connected = False
        self.pending: List[Tuple[TransferManifest, int]] = []
        self.region_cursor = 0

    def connect(self, qp: int) -> None:
        self.qp = qp
        self.qp_connected = True

    def push_pages(self, manifest: TransferManifest, pages: torch.Tensor, last_chunk: bool) -> bool:
        assert self.qp_connected, "connect() must run before push_pages()"  # ok: FC109
        n = pages.shape[0]
        if self.gather_buf is None:
            self.gather_buf = torch.empty(  # ok: FC107
                self.cfg.max_pages_per_transfer, self.cfg.page_numel, dtype=torch.bfloat16, device=self.device
            )
        offset = self.region_cursor
        self.region_cursor = (offset + n * self.cfg.page_bytes) % self.region.nbytes
        staged = self.region.pages(offset, n, self.cfg.page_numel)
        self.copy_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.copy_stream):
            torch.index_select(self.kv_cache_pages, 0, pages, out=self.gather_buf[:n])
            staged.copy_(self.gather_buf[:n], non_blocking=True)
            self.gather_done.record(self.copy_stream)
        manifest.region_offset = offset
        self.pending.append((manifest, n))
        if last_chunk:
            # the decode node must not see the flag before the last page is in the region
            self.copy_stream.synchronize()  # expect: FC101
        return self._post_ready()

    def _post_ready(self) -> bool:
        if not self.gather_done.query():  # ok: FC101
            return False
        for manifest, n in self.pending:
            self.verbs.post_write(self.qp, self.region.lkey, manifest.region_offset, n * self.cfg.page_bytes, manifest.seq)
        self.pending.clear()
        return True
