"""Per-step metadata for window layers (ring order) and global layers (full page lists)."""

from dataclasses import dataclass
from typing import Dict, List

import numpy as np
import torch

from swaring import RingPageTable, RingState, SWAConfig


@dataclass
class WindowStepMeta:
    batch_size: int
    win_indptr_cpu: torch.Tensor
    win_indices: torch.Tensor
    win_last_page_len: torch.Tensor
    win_last_page_len_cpu: torch.Tensor
    glb_indptr_cpu: torch.Tensor
    glb_indices: torch.Tensor
    glb_last_page_len_cpu: torch.Tensor
    window_offsets_cpu: torch.Tensor
    seq_lens: torch.Tensor
    positions: torch.Tensor
    page_row: torch.Tensor
    block_tables: torch.Tensor
    use_trtllm: bool


def _indptr(counts: np.ndarray) -> np.ndarray:
    out = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=out[1:])
    return out


class WindowMetadataBuilder:
    def __init__(self, cfg: SWAConfig, ring: RingPageTable, device: torch.device):
        self.cfg = cfg
        self.ring = ring
        self.device = device
        self.offsets_host = torch.zeros(16, dtype=torch.int32, pin_memory=True)

    def build(self, states: List[RingState], global_pages: Dict[int, List[int]]) -> WindowStepMeta:
        cfg = self.cfg
        page = cfg.page_size
        bs = len(states)
        rings = [self.ring.logical_pages(st) for st in states]
        win_counts = np.array([len(r) for r in rings], dtype=np.int32)
        win_indptr = _indptr(win_counts)
        lens = np.array([st.seq_len for st in states], dtype=np.int32)
        win_last = ((lens - 1) % page + 1).astype(np.int32)
        glb = [global_pages[st.row] for st in states]
        glb_indptr = _indptr(np.array([len(g) for g in glb], dtype=np.int32))
        if self.offsets_host.numel() < bs:
            self.offsets_host = torch.zeros(2 * bs, dtype=torch.int32, pin_memory=True)  # ok: FC107
        for i, st in enumerate(states):
            self.offsets_host[i] = st.window_offset
        seq_lens = torch.from_numpy(lens).to(self.device, non_blocking=True)
        longest = int(seq_lens.max())  # expect: FC101
        win_indices = torch.from_numpy(np.concatenate(rings)).to(self.device, non_blocking=True)
        total_pages = int(win_indptr[-1])
        counts_t = torch.from_numpy(win_counts).to(self.device, non_blocking=True)
        page_row = torch.repeat_interleave(
            torch.arange(bs, device=self.device), counts_t, output_size=total_pages)  # ok: FC101
        tables = np.zeros((bs, max(1, max(len(g) for g in glb))), dtype=np.int32)
        for i, g in enumerate(glb):
            tables[i, : len(g)] = g
        return WindowStepMeta(
            batch_size=bs,
            win_indptr_cpu=torch.from_numpy(win_indptr).pin_memory(),
            win_indices=win_indices,
            # the ring-rotation kernel wants the last-page lengths on the device
            win_last_page_len=torch.from_numpy(win_last).to(self.device, non_blocking=True),
            win_last_page_len_cpu=torch.from_numpy(win_last).pin_memory(),
            glb_indptr_cpu=torch.from_numpy(glb_indptr).pin_memory(),
            glb_indices=torch.from_numpy(np.concatenate(glb).astype(np.int32)).to(self.device, non_blocking=True),
            glb_last_page_len_cpu=torch.from_numpy(win_last.copy()).pin_memory(),
            window_offsets_cpu=self.offsets_host[:bs],
            seq_lens=seq_lens,
            positions=(seq_lens - 1).long(),
            page_row=page_row,
            block_tables=torch.from_numpy(tables).to(self.device, non_blocking=True),
            use_trtllm=longest > 4 * cfg.window,
        )
