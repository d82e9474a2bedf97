"""Dynamic NTK: a per-request alpha that stretches the rope base once a request passes the
trained context. The table is indexed by request slot and mirrored on the host."""

import numpy as np
import torch


def ntk_alpha(seq_len: int, trained_ctx: int, head_dim: int) -> float:
    if seq_len <= trained_ctx:
        return 1.0
    ratio = seq_len / trained_ctx
    return ratio ** (head_dim / (head_dim - 2))


class ScaleTable:
    def __init__(self, max_slots: int, trained_ctx: int, head_dim: int, device: torch.device):
        self.trained_ctx = trained_ctx
        self.head_dim = head_dim
        self.factors = torch.ones(max_slots, dtype=torch.float32, device=device)
        self.factors_host = np.ones(max_slots, dtype=np.float32)

    def set_factor(self, slot: int, alpha: float) -> None:
        assert alpha >= 1.0, "an NTK alpha below 1 would shrink the rope base"  # expect: FC109
        self.factors_host[slot] = alpha

    def refresh(self, slots, seq_lens_cpu: torch.Tensor) -> bool:
        changed = False
        for slot, n in zip(slots, seq_lens_cpu.tolist()):
            alpha = ntk_alpha(n, self.trained_ctx, self.head_dim)
            if alpha != self.factors_host[slot]:
                self.set_factor(slot, alpha)
                changed = True
        return changed

    def upload(self) -> None:
        self._check_mirror()
        self.factors.copy_(torch.from_numpy(self.factors_host), non_blocking=True)

    def _check_mirror(self) -> None:
        assert self.factors_host.shape[0] == self.factors.shape[0]  # ok: FC109

    @property
    def any_scaled(self) -> bool:
        return bool((self.factors > 1.0).any())  # expect: FC101

    def dump(self) -> dict:
        return {"alpha": self.factors.tolist()}  # ok: FC101
