"""Page-pressure balancing between the two GPUs, and an operator dump of a bucket's bound buffers."""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from migrt.attention import DeviceAttention
from migrt.migrator import KVMigrator
from migrt.worker import MigrationWorker


class LoadBalancer:
    def __init__(
        self,
        workers: Sequence[MigrationWorker],
        migrators: Dict[Tuple[int, int], KVMigrator],
        margin: float = 0.1,
        max_moves: int = 4,
    ) -> None:
        self.workers = list(workers)
        self.migrators = migrators
        self.margin = margin
        self.max_moves = max_moves

    def rebalance(self) -> List[int]:
        free = [w.alloc.num_free() for w in self.workers]
        src = 0 if free[0] < free[1] else 1
        dst = 1 - src
        total = sum(free)
        if total == 0 or free[dst] - free[src] < self.margin * total:
            return []
        w = self.workers[src]
        ps = w.table.page_size
        # only requests that just filled a page: no partial page to hand over; longest first
        cands = sorted(
            (rid for rid, n in w.table.lens.items() if n % ps == 0 and rid not in w.migrating_in),
            key=lambda rid: -w.table.lens[rid],
        )
        moved = cands[: self.max_moves]
        for rid in moved:
            self.migrators[(src, dst)].start(rid)
        return moved


def replay_debug_dump(attn: DeviceAttention, bs: int) -> Dict[str, List[int]]:
    """Operator tool: a bucket's bound indptr as the last replay preparation left it."""
    return {"indptr": attn.graph_indptr[: bs + 1].cpu().tolist()}  # ok: FC101
