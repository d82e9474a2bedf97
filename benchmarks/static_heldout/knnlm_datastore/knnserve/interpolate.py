"""p(y|x) = (1 - lambda) * p_LM(y|x) + lambda * p_kNN(y|x)."""
from __future__ import annotations

from typing import Optional

import torch


class KnnInterpolator:
    _backend = "torch"  # "torch" scatter or a fused triton kernel

    def __init__(self, settings, device: torch.device):
        self.settings = settings
        self.device = device
        self.lmbda = settings.lmbda
        self._knn_scratch: Optional[torch.Tensor] = None

    def mix(self, lm_logits: torch.Tensor, knn_dists: torch.Tensor, knn_vals: torch.Tensor) -> torch.Tensor:
        lm_p = torch.softmax(lm_logits.float(), dim=-1)
        if (knn_dists[:, 0] > self.settings.max_dist).all():  # expect: FC101
            return lm_p  # nothing in the datastore is close to any row
        w = torch.softmax(-knn_dists / self.settings.temperature, dim=-1)
        w = torch.where(knn_vals >= 0, w, torch.zeros_like(w))  # ok: FC101
        if self._knn_scratch is None:
            self._knn_scratch = torch.zeros(self.settings.max_batch, self.settings.vocab_size, device=self.device)  # ok: FC107
        knn_p = self._knn_scratch[: lm_logits.shape[0]].zero_()
        knn_p.scatter_add_(1, knn_vals.clamp_min(0), w)
        return (1.0 - self.lmbda) * lm_p + self.lmbda * knn_p
