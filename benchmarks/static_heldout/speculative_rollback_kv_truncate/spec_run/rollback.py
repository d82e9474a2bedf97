"""Roll rejected draft tokens back out of the paged KV cache."""

from __future__ import annotations

import logging
from typing import List

import numpy as np
import torch

from spec_attn.backend import SpecAttnBackend
from specroll.config import SpecConfig
from specroll.pages import PagedKVState, PagePool
from specroll.verify_types import VerifyBatch, VerifyOutput

logger = logging.getLogger(__name__)


class KVRollback:
    def __init__(self, cfg: SpecConfig, state: PagedKVState, pool: PagePool,
                 backend: SpecAttnBackend, device: torch.device):
        self.cfg = cfg
        self.state = state
        self.pool = pool
        self.backend = backend
        self.device = device
        # "torch" masks rejected token slots on the device, "none" leaves them
        self._backend = "torch"
        self.token_valid = torch.ones(cfg.max_batch, cfg.max_context, dtype=torch.bool, device=device)

    def rollback(self, out: VerifyOutput, vb: VerifyBatch, rows: List[int]) -> List[int]:
        """Truncate each row to its accepted drafts; return the pages freed."""
        bs = len(rows)
        assert out.accept_counts.shape[0] == bs  # expect: FC109
        accepted = out.accept_counts.tolist()  # expect: FC101
        logger.debug("accepted drafts per row: %s", out.accept_counts)  # ok: FC101
        rejected_np = vb.draft_lens_cpu[:bs].numpy() - np.asarray(accepted, dtype=np.int32)
        if (rejected_np < 0).any():
            raise RuntimeError(f"accepted more drafts than proposed: {out.accept_counts}")  # ok: FC101

        freed: List[int] = []
        for i, row in enumerate(rows):
            if rejected_np[i]:
                freed.extend(self.state.truncate(row, int(rejected_np[i])))
        new_lens_np = self.state.seq_lens(rows)
        self._scrub(out, rejected_np, new_lens_np)

        # rewind the last-page lengths the target graphs read
        _, _, last = self.state.page_table(rows)
        bufs = self.backend.target_bufs
        bufs.last_len_host[:bs].copy_(torch.from_numpy(last))  # ok: FC104
        new_last = bufs.last_len[:bs] - out.num_rejected
        bufs.last_len[:bs].copy_(torch.where(new_last > 0, new_last, new_last + self.cfg.page_size))  # expect: FC104

        self.pool.free(freed)
        return freed

    def _scrub(self, out: VerifyOutput, rejected_np: np.ndarray, new_lens_np: np.ndarray) -> None:
        if self._backend != "torch":  # ok: FC103
            return
        if self.backend.verify_wrapper._kv_layout != "NHD":  # expect: FC103
            raise NotImplementedError("token scrub assumes NHD pages")
        bs = len(new_lens_np)
        total = int(rejected_np.sum())
        if total == 0:
            return
        rows = torch.arange(bs, device=self.device)
        slot_rows = torch.repeat_interleave(rows, out.num_rejected)  # expect: FC101
        new_lens = torch.from_numpy(new_lens_np).to(self.device, non_blocking=True)
        first = torch.repeat_interleave(new_lens, out.num_rejected, output_size=total)  # ok: FC101
        excl = torch.cumsum(out.num_rejected, 0) - out.num_rejected
        offs = torch.arange(total, device=self.device) - torch.repeat_interleave(excl, out.num_rejected, output_size=total)
        self.token_valid.index_put_((slot_rows, first + offs), torch.zeros((), dtype=torch.bool, device=self.device))
