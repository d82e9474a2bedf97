"""High-KV-deviation (HKVD) token selection after the first layer."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from blendserve.batch import ForwardBatch


@dataclass
class SelectedTokens:
    token_idx: torch.Tensor  # device, into the packed prompt tokens of the batch
    req_ids: torch.Tensor  # device, request row of every selected token
    positions: torch.Tensor  # device
    slots: torch.Tensor  # device, KV slots the recomputed tokens write
    counts_np: np.ndarray  # host, selected tokens per request (ratio of its length, query included)


class HKVDSelector:
    def __init__(self, recompute_ratio: float, device: torch.device):
        assert 0.0 < recompute_ratio <= 1.0, "recompute_ratio must be in (0, 1]"  # expect: FC109
        self.ratio = recompute_ratio
        self.device = device

    def counts(self, fb: ForwardBatch, query_lens: np.ndarray) -> np.ndarray:
        reused = fb.prompt_lens_np - query_lens
        return (np.ceil(self.ratio * reused).astype(np.int64) + query_lens).astype(np.int64)

    def select(self, k_new: torch.Tensor, fb: ForwardBatch, query_lens: np.ndarray) -> SelectedTokens:
        # deviation of the recomputed first-layer keys from the chunk-local cached ones
        dev = (k_new.float() - fb.cached_k0.float()).pow(2).sum(dim=(-1, -2))
        dev = torch.where(fb.is_query_token, torch.full_like(dev, float("inf")), dev)
        counts = self.counts(fb, query_lens)
        qo = fb.qo_indptr_cpu.numpy()
        picks, rows = [], []
        for i in range(fb.batch_size):
            s, e = int(qo[i]), int(qo[i + 1])
            top = torch.topk(dev[s:e], int(counts[i])).indices.sort().values + s
            picks.append(top)
            rows.append(torch.full_like(top, i))
        token_idx = torch.cat(picks)
        return SelectedTokens(
            token_idx=token_idx,
            req_ids=torch.cat(rows),
            positions=fb.positions[token_idx],
            slots=fb.out_cache_loc[token_idx],
            counts_np=counts,
        )
