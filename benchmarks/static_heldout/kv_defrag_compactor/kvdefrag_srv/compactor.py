"""Background compaction: move live pages above the holes down into them.

A pass picks moves on the host (numpy owner map), copies the pages on a side stream, and rewrites every
page list that names a moved page.  The moves stay "pending" (``RemapTable.pending_gpu``) until the next
step has waited for the copy event; ``finish`` publishes them.
"""

import logging
from typing import Dict, List

import numpy as np
import torch

from kvdefrag.config import DefragConfig
from kvdefrag.kernels.copy_pages import move_pages
from kvdefrag.pages import PagePool
from kvdefrag.remap import RemapTable
from kvdefrag_srv.attention import DefragAttention

logger = logging.getLogger(__name__)


class CompactionScheduler:
    """Decides when a pass runs and keeps the device queue of moves for the copy kernels."""

    def __init__(self, cfg: DefragConfig, pool: PagePool, device: torch.device):
        self.cfg = cfg
        self.pool = pool
        self.device = device
        self.threshold = cfg.frag_threshold
        self.free_mask = torch.zeros(cfg.num_pages, dtype=torch.bool, device=self.device)
        self.move_src = torch.zeros(0, dtype=torch.int64, device=self.device)
        self.move_dst = None
        self.cooldown = 0

    def refresh(self) -> None:
        torch.lt(self.pool.owner_gpu, 0, out=self.free_mask)

    def should_compact(self) -> bool:
        if self.cooldown > 0:
            self.cooldown -= 1
            return False
        hw = self.pool.high_water
        if hw == 0:
            return False
        self.refresh()
        holes = float(self.free_mask[:hw].float().mean())  # expect: FC101
        return holes > self.threshold

    def enqueue(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        self.move_src = torch.cat([self.move_src, src])  # expect: FC107
        if self.move_dst is None:
            self.move_dst = torch.empty(self.cfg.moves_per_pass, dtype=torch.int64, device=self.device)  # ok: FC107
        self.move_dst[: dst.numel()].copy_(dst)


class Compactor:
    def __init__(
        self,
        cfg: DefragConfig,
        pool: PagePool,
        attn: DefragAttention,
        remap: RemapTable,
        scheduler: CompactionScheduler,
        threshold: float,
    ):
        assert 0.0 < threshold < 1.0, "threshold is a fraction of the high-water mark"  # expect: FC109
        self.cfg = cfg
        self.pool = pool
        self.attn = attn
        self.remap = remap
        self.scheduler = scheduler
        self.device = attn.device
        self.copy_stream = torch.cuda.Stream()
        self.copied = torch.cuda.Event()
        self.touched_owners = torch.zeros(cfg.num_pages, dtype=torch.int32, device=self.device)
        self.inflight: Dict[int, List[int]] = {}
        for bs, w in attn.graph_wrappers.items():
            if w._paged_kv_indices_buf.data_ptr() != attn.kv_indices.data_ptr():  # expect: FC103
                raise RuntimeError(f"bucket {bs}: graph wrapper does not read the shared kv_indices")

    def _pick_moves(self):
        hw = self.pool.high_water
        owner = self.pool.owner_np
        holes = np.flatnonzero(owner[:hw] < 0)
        live_tail = np.flatnonzero(owner[:hw] >= 0)[::-1]
        n = min(holes.size, live_tail.size, self.cfg.moves_per_pass)
        src = live_tail[:n]
        dst = holes[:n]
        keep = src > dst
        return src[keep].astype(np.int32), dst[keep].astype(np.int32)

    def _check_disjoint(self, src: np.ndarray, dst: np.ndarray) -> None:
        assert np.intersect1d(src, dst).size == 0  # ok: FC109

    def run_pass(self) -> int:
        src_np, dst_np = self._pick_moves()
        n_moves = int(src_np.size)
        if n_moves == 0:
            return 0
        if self.scheduler.move_src.numel() + n_moves > self.cfg.num_pages:
            raise RuntimeError(f"move queue overflow, {self.remap.pending_gpu.sum()} moves still pending")  # ok: FC101
        self._check_disjoint(src_np, dst_np)
        for s, d in zip(src_np.tolist(), dst_np.tolist()):
            self.remap.record_move(s, d)

        src = torch.from_numpy(src_np).to(self.device, non_blocking=True).long()
        dst = torch.from_numpy(dst_np).to(self.device, non_blocking=True).long()
        self.remap.pending_gpu.index_fill_(0, src, 1)
        self.remap.map_gpu.index_copy_(0, src, dst.int())
        moved_owner = self.pool.owner_gpu[self.remap.pending_gpu != 0]  # expect: FC101
        self.touched_owners.index_fill_(0, moved_owner.long(), 1)
        self.scheduler.enqueue(src, dst)

        with torch.cuda.stream(self.copy_stream):
            move_pages(self.pool.kv_cache, src, dst)
            self.copied.record()

        # the live page list of the current bucket: patch the moved ids where they appear
        n = int(self.attn.kv_indptr_host[self.attn.last_bs])
        live_ids = self.attn.kv_indices_host[:n].numpy()
        pos_np = np.flatnonzero(np.isin(live_ids, src_np))
        if pos_np.size:
            new_np = self.remap.map_np[live_ids[pos_np]]
            pos = torch.from_numpy(pos_np).to(self.device, non_blocking=True)
            new = torch.from_numpy(new_np).to(self.device, non_blocking=True)
            self.attn.kv_indices.index_copy_(0, pos, new)  # expect: FC104
            self.attn.kv_indices_host[torch.from_numpy(pos_np)] = torch.from_numpy(new_np)

        # the eager step's page list is reused while the batch does not change
        m = self.attn.eager_total
        if m:
            eager = self.attn.eager_kv_indices[:m].long()
            moved = torch.where(self.remap.pending_gpu[eager] != 0, self.remap.map_gpu[eager], eager.int())  # ok: FC101
            self.attn.eager_kv_indices[:m].copy_(moved)  # ok: FC104

        owners = self.pool.owner_np[src_np]
        self.pool.owner_np[dst_np] = owners
        self.pool.owner_np[src_np] = -1
        self.inflight = {}
        for o, s in zip(owners.tolist(), src_np.tolist()):
            self.inflight.setdefault(o, []).append(s)
        logger.debug("compaction pass queued %d moves", n_moves)
        return n_moves

    def inflight_by_row(self, row_owner_np: np.ndarray) -> Dict[int, List[int]]:
        return {r: self.inflight[o] for r, o in enumerate(row_owner_np.tolist()) if o in self.inflight}

    def finish(self) -> None:
        """Publish the moves once the copy stream is done with them."""
        if not self.remap.has_pending():
            return
        torch.cuda.current_stream().wait_event(self.copied)
        self.pool.sync_owner_mirror()
        self.remap.publish()
        self.inflight = {}
        self.scheduler.cooldown = 16
