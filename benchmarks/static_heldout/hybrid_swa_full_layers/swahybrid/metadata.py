"""Per-step batch and the metadata of both layer kinds, built every eager step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import torch

from swahybrid.config import HybridConfig
from swahybrid.pools import TwoPools


@dataclass
class ForwardBatch:
    rids: List[int]
    is_decode: bool
    input_ids: torch.Tensor
    positions: torch.Tensor
    full_loc: torch.Tensor
    swa_loc: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    window_start: Optional[torch.Tensor] = None
    qo_indptr_cpu: Optional[torch.Tensor] = None
    use_trtllm_full: bool = False
    swa_wrapper: Any = None
    full_wrapper: Any = None
    metadata: Optional["HybridMetadata"] = None

    @property
    def batch_size(self) -> int:
        return len(self.rids)


@dataclass
class HybridMetadata:
    # device copies feed the fused KV-append kernel; the planner gets the *_cpu ones
    swa_kv_indptr: torch.Tensor
    swa_kv_indptr_cpu: torch.Tensor
    swa_kv_indices: torch.Tensor
    swa_last_page_cpu: torch.Tensor
    full_kv_indptr_cpu: torch.Tensor
    full_kv_indices: torch.Tensor
    full_last_page_len: torch.Tensor
    full_last_page_cpu: torch.Tensor
    block_tables: torch.Tensor
    max_seq_len: int


def _csr(lists: Sequence[Sequence[int]]) -> Tuple[np.ndarray, np.ndarray]:
    indptr = np.zeros(len(lists) + 1, dtype=np.int32)
    np.cumsum([len(p) for p in lists], out=indptr[1:])
    flat = np.concatenate([np.asarray(p, np.int32) for p in lists]) if lists else np.zeros(0, np.int32)
    return indptr, flat


def _pinned(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).pin_memory()


class HybridMetadataBuilder:
    def __init__(self, cfg: HybridConfig, pools: TwoPools, device: torch.device) -> None:
        self.cfg = cfg
        self.pools = pools
        self.device = device
        self.page_size = cfg.page_size
        self.window = cfg.window
        # the engine's own cap on rows per step (chunked prefill splits above it)
        self._max_total_num_rows = cfg.max_num_tokens
        self.window_start: Optional[torch.Tensor] = None
        self.indices_dev: Optional[torch.Tensor] = None

    def retire_left_window(self, fb: ForwardBatch) -> None:
        """Rows that just opened a page: their oldest SWA page left the window."""
        seq_np = fb.seq_lens_cpu.numpy()
        leaving = np.nonzero((seq_np % self.page_size == 1) & (seq_np > self.window + self.page_size))[0]  # ok: FC101
        for row in leaving.tolist():
            self.pools.swa.retire_oldest(fb.rids[row])

    def build(self, fb: ForwardBatch) -> HybridMetadata:
        n = fb.batch_size
        if n > self._max_total_num_rows:  # ok: FC103
            raise ValueError(f"{n} rows in one step; the engine caps steps at {self._max_total_num_rows}")
        seq_np = fb.seq_lens_cpu.numpy()
        self.retire_left_window(fb)

        # SWA layers use window-relative rotary positions past the window
        self.window_start = torch.zeros_like(fb.seq_lens)  # expect: FC107
        past = fb.seq_lens > self.window
        self.window_start[past] = fb.seq_lens[past] - self.window  # expect: FC101
        fb.window_start = self.window_start

        swa_indptr, swa_flat = _csr([self.pools.swa.pages[r] for r in fb.rids])
        full_indptr, full_flat = _csr([self.pools.full.pages_of(r) for r in fb.rids])
        last = ((seq_np - 1) % self.page_size + 1).astype(np.int32)
        if self.indices_dev is None:
            self.indices_dev = torch.empty(self.cfg.full_pool_pages, dtype=torch.int32, device=self.device)  # ok: FC107
        full_indices = self.indices_dev[: full_flat.size]
        full_indices.copy_(torch.from_numpy(full_flat), non_blocking=True)
        width = int(np.diff(full_indptr).max()) if n else 1
        table = np.zeros((n, width), dtype=np.int32)
        for i in range(n):
            row = full_flat[full_indptr[i] : full_indptr[i + 1]]
            table[i, : row.size] = row
        return HybridMetadata(
            swa_kv_indptr=_pinned(swa_indptr).to(self.device, non_blocking=True),
            swa_kv_indptr_cpu=_pinned(swa_indptr),
            swa_kv_indices=_pinned(swa_flat).to(self.device, non_blocking=True),
            swa_last_page_cpu=_pinned(last),
            full_kv_indptr_cpu=_pinned(full_indptr),
            full_kv_indices=full_indices,
            full_last_page_len=_pinned(last).to(self.device, non_blocking=True),
            full_last_page_cpu=_pinned(last),
            block_tables=_pinned(table).to(self.device, non_blocking=True),
            max_seq_len=int(fb.seq_lens_cpu.max()),  # ok: FC101
        )
