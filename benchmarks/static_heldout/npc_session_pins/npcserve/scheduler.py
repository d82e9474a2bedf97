"""Picks which sessions speak this tick (host only) and stages their inputs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from npcserve.sessions.table import SessionTable


@dataclass
class TickBatch:
    rows: np.ndarray
    session_ids: List[int]
    seq_lens_np: np.ndarray
    seq_lens_device: torch.Tensor
    input_ids: torch.Tensor
    positions: torch.Tensor
    persona_bias: Optional[torch.Tensor] = None

    @property
    def size(self) -> int:
        return len(self.session_ids)


class TickScheduler:
    def __init__(self, cfg, table: SessionTable, device: torch.device):
        self.cfg = cfg
        self.table = table
        self.device = device
        self.last_tokens_np = np.zeros(cfg.max_sessions, dtype=np.int64)
        self.input_ids_pinned = torch.zeros(cfg.max_active, dtype=torch.int64, pin_memory=True)
        self.positions_pinned = torch.zeros(cfg.max_active, dtype=torch.int64, pin_memory=True)
        self._last_rows: Optional[np.ndarray] = None
        self.same_rows_as_last_tick = False

    def take_new_lines(self, pending: Dict[int, List[int]]) -> List[Tuple[int, List[int]]]:
        taken = []
        for sid in list(pending):
            slot = self.table.slots.get(sid)
            if slot is None:
                continue
            taken.append((slot.row, pending.pop(sid)))
            if len(taken) == self.cfg.max_active:
                break
        return taken

    def next_batch(self) -> Optional[TickBatch]:
        live = [s for s in self.table.slots.values() if s.idle_ticks == 0]
        if not live:
            return None
        live.sort(key=lambda s: s.row)
        live = live[: self.cfg.max_active]
        rows = np.fromiter((s.row for s in live), dtype=np.int64, count=len(live))
        lens = self.table.context_lens_np[rows]
        longest = int(lens.max())  # ok: FC101
        if longest >= self.cfg.max_context:
            raise RuntimeError(f"session row {int(rows[lens.argmax()])} reached {longest} tokens")
        n = len(live)
        self.same_rows_as_last_tick = self._last_rows is not None and np.array_equal(self._last_rows, rows)
        self._last_rows = rows
        ids_np = self.input_ids_pinned.numpy()
        pos_np = self.positions_pinned.numpy()
        ids_np[:n] = self.last_tokens_np[rows]
        pos_np[:n] = lens
        return TickBatch(
            rows=rows,
            session_ids=[s.session_id for s in live],
            seq_lens_np=lens + 1,
            seq_lens_device=torch.from_numpy(lens + 1).to(self.device, non_blocking=True),
            input_ids=self.input_ids_pinned[:n].to(self.device, non_blocking=True),
            positions=self.positions_pinned[:n].to(self.device, non_blocking=True),
        )
