"""Records each step's inputs for deterministic replay."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Deque, Dict, List, Optional

import numpy as np
import torch
from flashcheck import hot_path


@dataclasses.dataclass
class StepRecord:
    step: int
    batch_size: int
    num_prefill: int
    input_ids: np.ndarray
    positions: np.ndarray
    seq_lens: np.ndarray
    kv_indptr: np.ndarray
    kv_indices: np.ndarray
    last_len: np.ndarray
    plan_state: Dict[str, Any]
    token_slot: int
    checksum: Optional[float] = None
    tokens: Optional[np.ndarray] = None


class StepRecorder:
    """Keeps the last ``capacity`` steps; sampled tokens land in a pinned ring."""

    def __init__(self, capacity: int, max_batch: int):
        self.capacity = capacity
        self.max_batch = max_batch
        self._backend = "numpy"  # "numpy" keeps arrays, "npz" spills to disk
        self.records: Deque[StepRecord] = collections.deque(maxlen=capacity)
        self.token_ring: List[torch.Tensor] = [
            torch.zeros(max_batch, dtype=torch.long, pin_memory=True) for _ in range(capacity)
        ]
        self.ring_events = [torch.cuda.Event() for _ in range(capacity)]

    @hot_path
    def record(self, step: int, batch, tokens: torch.Tensor, plan_state: Dict[str, Any]) -> StepRecord:
        assert batch.batch_size <= self.max_batch  # expect: FC109
        seq_lens = batch.seq_lens_cpu.numpy().copy()  # ok: FC101
        kv_indices = batch.kv_indices.cpu().numpy()  # expect: FC101
        slot = step % self.capacity
        bs = tokens.shape[0]
        if bs > self.token_ring[slot].numel():
            self.token_ring[slot] = torch.empty(2 * bs, dtype=torch.long, pin_memory=True)  # ok: FC107
        self.token_ring[slot][:bs].copy_(tokens, non_blocking=True)  # ok: FC101
        self.ring_events[slot].record()
        rec = StepRecord(
            step=step,
            batch_size=batch.batch_size,
            num_prefill=batch.num_prefill,
            input_ids=batch.input_ids_np.copy(),
            positions=batch.positions_np.copy(),
            seq_lens=seq_lens,
            kv_indptr=batch.kv_indptr_cpu.numpy().copy(),
            kv_indices=kv_indices,
            last_len=batch.last_len_cpu.numpy().copy(),
            plan_state=plan_state,
            token_slot=slot,
        )
        self.records.append(rec)
        return rec

    def flush(self) -> List[StepRecord]:
        """Resolve the sampled tokens of every kept record (off the step path)."""
        for rec in self.records:
            if rec.tokens is None:
                self.ring_events[rec.token_slot].synchronize()
                rec.tokens = self.token_ring[rec.token_slot][: rec.batch_size].numpy().copy()
        return list(self.records)

    def dump(self, path: str) -> None:
        recs = self.flush()
        if self._backend == "npz":  # ok: FC103
            np.savez(path, **{f"step{r.step}_tokens": r.tokens for r in recs})
        else:
            torch.save([dataclasses.asdict(r) for r in recs], path)
