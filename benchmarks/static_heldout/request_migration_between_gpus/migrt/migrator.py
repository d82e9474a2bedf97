"""Live migration ``src -> dst``.

At ``start`` the source stops decoding the request and the destination adopts it: from the next step on it
decodes there, attending the pages already landed (and the ones it wrote since) locally and the pages not copied
yet on the source through the peer wrapper. Every step ``pump`` lands finished chunks (the destination's page
table is rebuilt and its rows pushed to the device mirror) and launches the next chunk. The balancer only moves
requests that just filled a page, so there is no partial page to hand over.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import torch

from gpumig.limits import MigrationLimits
from gpumig.topology import PeerLink
from gpumig.transfer import PeerCopy
from migrt.worker import MigrationWorker


@dataclass
class Migration:
    rid: int
    src_pages: List[int]
    dst_pages: List[int]
    copied: int = 0
    launched: int = 0
    pending: Optional[torch.cuda.Event] = None

    def remaining_src(self) -> List[int]:
        return self.src_pages[self.copied :]


class KVMigrator:
    def __init__(self, src: MigrationWorker, dst: MigrationWorker, link: PeerLink, limits: MigrationLimits) -> None:
        self.src = src
        self.dst = dst
        self.link = link
        self.dst_table = dst.table
        self.dst_attn = dst.attn
        self.copier = PeerCopy(link, src.pool, dst.pool, limits.num_layers)
        self.chunk = limits.pages_per_copy_chunk
        self.inflight: Dict[int, Migration] = {}
        self._idx_stage: Optional[torch.Tensor] = None

    def start(self, rid: int) -> None:
        if not self.link.peer_ok:
            tokens = list(self.src.tokens[rid])
            self.src.release(rid)
            self.dst.prefill(rid, tokens)
            return
        length = self.src.table.lens[rid]
        src_row = self.src.table.rows[rid]
        last_token = self.src.last_ids[src_row : src_row + 1].to(self.dst.device, non_blocking=True)
        src_pages = self.src.table.remove(rid)
        mig = Migration(rid, src_pages, self.dst.alloc.take(len(src_pages)))
        self.inflight[rid] = mig
        self.dst.tokens[rid] = self.src.tokens.pop(rid, [])
        self.dst.adopt(rid, length, last_token, mig)
        self.dst_attn.peer_kv = self.src.pool.kv

    def pump(self) -> None:
        for mig in list(self.inflight.values()):
            if mig.pending is not None:
                if not mig.pending.query():  # ok: FC101
                    continue
                self._land(mig)
            if mig.copied == len(mig.src_pages):
                self._finish(mig)
                continue
            lo, hi = mig.copied, min(mig.copied + self.chunk, len(mig.src_pages))
            mig.pending = self.copier.copy_pages(mig.src_pages[lo:hi], mig.dst_pages[lo:hi])
            mig.launched = hi
            if hi == len(mig.src_pages):
                # last chunk: wait for it, so the source pages go back in this step
                mig.pending.synchronize()  # expect: FC101
                self._land(mig)
                self._finish(mig)

    def _land(self, mig: Migration) -> None:
        lo, hi = mig.copied, mig.launched
        written_here = self.dst_table.pages[mig.rid][lo:]
        mig.copied = hi
        mig.pending = None
        pages = mig.dst_pages[:hi] + written_here
        width = self.dst_table.table_np.shape[1]
        if len(pages) > width:
            pad = len(pages) - width
            self.dst_table.table_np = np.pad(self.dst_table.table_np, ((0, 0), (0, pad)))
            extra = torch.zeros(self.dst_table.table_dev.shape[0], pad, dtype=torch.int32, device=self.dst.device)
            self.dst_table.table_dev = torch.cat([self.dst_table.table_dev, extra], dim=1)  # expect: FC107
        self.dst_table.set_pages(mig.rid, pages)
        self.dst_table.push_rows([mig.rid])
        off = self.dst.last_offsets.get(mig.rid)
        if off is not None:
            # let the next replay read the landed copies without waiting for the next batch build
            if self._idx_stage is None:
                self._idx_stage = torch.empty(self.chunk, dtype=torch.int32, device=self.dst.device)  # ok: FC107
            ids = self._idx_stage[: hi - lo]
            ids.copy_(torch.tensor(mig.dst_pages[lo:hi], dtype=torch.int32), non_blocking=True)
            self.dst_attn.graph_indices[off + lo : off + hi].copy_(ids)  # expect: FC104
        self.dst.peer_dirty = True

    def _finish(self, mig: Migration) -> None:
        self.src.alloc.give_back(mig.src_pages)
        self.inflight.pop(mig.rid, None)
        self.dst.migrating_in.pop(mig.rid, None)
        if not self.inflight:
            self.dst_attn.peer_kv = None
        self.dst.peer_dirty = True
