"""Acceptance bookkeeping: counted on the device every step, summed on the host a step later."""

from __future__ import annotations

from typing import Optional

import torch

from lookahead import LookaheadConfig
from la_attn.batch import LookaheadBatch
from la_attn.decode_backend import DecodeBackend


class AcceptanceTracker:
    def __init__(self, cfg: LookaheadConfig, decode: DecodeBackend, device: torch.device):
        self.cfg, self.decode, self.device = cfg, decode, device
        self.accepted_dev: Optional[torch.Tensor] = None
        self.query_lens_dev = torch.ones(cfg.max_batch, dtype=torch.int32, device=device)
        self.draft_lens_dev = torch.zeros(cfg.max_batch, dtype=torch.int32, device=device)
        self.accepted_host = torch.zeros(cfg.max_batch, dtype=torch.int32, pin_memory=True)
        self.copied = torch.cuda.Event()
        self.pending_rows = 0
        self.total_accepted = 0
        self.longest_run = 0

    def load(self, batch: LookaheadBatch) -> None:
        n = batch.num_rows
        self.query_lens_dev[:n].copy_(batch.query_lens_cpu, non_blocking=True)
        self.draft_lens_dev[:n].copy_(batch.draft_lens_cpu, non_blocking=True)

    def _drain(self) -> None:
        if self.pending_rows and self.copied.query():
            self.total_accepted += int(self.accepted_host[: self.pending_rows].sum())
            self.pending_rows = 0

    def commit(self, drafts: torch.Tensor, targets: torch.Tensor, n: int) -> torch.Tensor:
        """drafts [n, D] (-1 padded); targets [n, D + 1], the argmax at each verified position."""
        if self.accepted_dev is None:
            self.accepted_dev = torch.zeros(self.cfg.max_batch, dtype=torch.int32, device=self.device)  # ok: FC107
        self._drain()
        accepted = (drafts == targets[:, :-1]).int().cumprod(dim=1).sum(dim=1).int()
        self.accepted_dev[:n].copy_(accepted)
        rejected = self.draft_lens_dev[:n] - accepted
        # slots were reserved for every draft token: hand the rejected ones back in the last page
        self.decode.kv_last_page_len_buf[:n].sub_(rejected)  # expect: FC104
        self.longest_run = max(self.longest_run, max(self.accepted_dev[:n]))  # expect: FC101
        self.accepted_host[:n].copy_(self.accepted_dev[:n], non_blocking=True)  # ok: FC101
        self.copied.record()
        self.pending_rows = n
        return accepted
