"""Per-step forking: beams take over their parents' histories, partly filled shared pages are copied."""
from __future__ import annotations

from typing import List

import numpy as np
import torch

from bsf.config import BeamConfig
from bsf.kernels.cow_copy import PageCopier
from bsf.pages import CowPageTable
from bsf_engine.attention import BeamDecodeAttention


class PageForker:
    def __init__(self, cfg: BeamConfig, table: CowPageTable, attn: BeamDecodeAttention, copier: PageCopier):
        self.cfg, self.table, self.attn, self.copier = cfg, table, attn, copier
        self.page_size = cfg.page_size
        self.copies_done = 0

    def fork_step(self, width: int, n_req: int, parent_rows: List[int], parents_gpu: torch.Tensor) -> None:
        rows = n_req * width
        copies = self.table.fork(parent_rows)
        # a parent chosen by more than one child shares its partly filled last page
        shared_last = [p for _, p, _ in copies if int(self.table.refcount_np[p]) > 0]  # ok: FC101
        needs_copy = (self.attn.seq_lens_gpu[parents_gpu] % self.page_size) != 0
        n_copy = int(needs_copy.sum())  # expect: FC101
        if n_copy and copies:
            scratch = self.attn.fork_workspace
            pairs = torch.tensor([[s for _, s, _ in copies], [d for _, _, d in copies]], dtype=torch.int32)
            scratch[: 2 * len(copies)].copy_(pairs.flatten(), non_blocking=True)
            self.copier.copy_pages(scratch[: len(copies)], scratch[len(copies) : 2 * len(copies)], len(copies))
            self.copies_done += len(shared_last)
        if width in self.attn.kv_indices and copies:
            # the copied page replaces the shared one at the end of the beam's own segment
            pos = torch.tensor([self.attn.last_page_pos(width, r) for r, _, _ in copies], dtype=torch.int64)
            dst = torch.tensor([d for _, _, d in copies], dtype=torch.int32)
            self.attn.kv_indices[width].index_copy_(0, pos.to(self.attn.device), dst.to(self.attn.device))  # expect: FC104
        # the next token of a row whose pages are full starts a page of its own
        for row in np.flatnonzero(self.table.seq_lens_np[:rows] % self.page_size == 0):
            self.table.append_page(int(row))
