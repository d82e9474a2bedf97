"""Greedy acceptance of the draft chain against the target's argmax."""

import numpy as np
import torch

from dualspec.config import SpecConfig
from dualspec.shared_bufs import SharedPageBuffers


@torch.jit.script
def greedy_accept_len(draft: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    assert draft.dim() == 2  # ok: FC109
    match = (draft == target).to(torch.int32)
    return match.cumprod(dim=1).sum(dim=1)


class Acceptor:
    def __init__(self, cfg: SpecConfig, shared: SharedPageBuffers, device):
        self.cfg = cfg
        self.shared = shared
        self.k = cfg.num_draft_tokens
        self.device = device
        self.accepted_pinned = torch.zeros(cfg.max_batch_size, dtype=torch.int32, pin_memory=True)
        self.copy_done = torch.cuda.Event()
        self.accept_scratch = None

    def accept_tokens(self, draft_ids, target_logits, bs: int):
        assert draft_ids.shape[0] == bs  # expect: FC109
        k = self.k
        target_ids = target_logits.argmax(dim=-1).view(bs, k + 1)
        n_acc = greedy_accept_len(draft_ids, target_ids[:, :k])
        self.accept_scratch = torch.zeros(self.cfg.max_batch_size, k + 1, dtype=torch.long, device=self.device) if self.accept_scratch is None else self.accept_scratch  # ok: FC107
        keep = torch.arange(k + 1, device=target_ids.device).unsqueeze(0) <= n_acc.unsqueeze(1)
        emitted = self.accept_scratch[:bs]
        emitted.copy_(torch.where(keep, target_ids, torch.full_like(target_ids, -1)))  # ok: FC101
        # roll the draft KV back to the accepted prefix
        self.shared.draft_last_page[:bs] -= k - n_acc  # expect: FC104
        self.accepted_pinned[:bs].copy_(n_acc, non_blocking=True)  # ok: FC101
        self.copy_done.record()
        counts = n_acc.tolist()  # expect: FC101
        self.shared.draft_last_page_np[:bs] -= k - np.asarray(counts, dtype=np.int32)  # ok: FC104
        return emitted, n_acc, counts
