"""An IVF-flat datastore of (context vector -> next token) pairs, held entirely on the GPU.

Every inverted list is padded to `list_cap` entries (padding has value -1), so a search is a fixed
amount of work per query and needs no host round trip.
"""
from __future__ import annotations

import torch


class IVFFlatIndex:
    def __init__(self, centroids: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, list_cap: int, nprobe: int,
                 device: torch.device):
        assert keys.shape[0] == vals.shape[0] == centroids.shape[0] * list_cap  # expect: FC109
        self.device = device
        self.centroids = centroids.to(device, torch.float32)
        self.keys = keys.to(device, torch.float16)
        self.vals = vals.to(device, torch.int64)
        self.list_cap = list_cap
        self.nprobe = nprobe
        self.arange_cap = torch.arange(list_cap, device=device)
        self._validate_lists()

    def _validate_lists(self) -> None:
        assert self.keys.dim() == 2 and self.keys.shape[1] == self.centroids.shape[1], "key width"  # ok: FC109

    @property
    def num_entries(self) -> int:
        return self.keys.shape[0]

    def search(self, queries: torch.Tensor, k: int):
        q = queries.float()
        probe = torch.cdist(q, self.centroids).topk(self.nprobe, dim=-1, largest=False).indices
        cand = (probe.unsqueeze(-1) * self.list_cap + self.arange_cap).flatten(1)
        d = (self.keys[cand].float() - q.unsqueeze(1)).pow(2).sum(-1)
        cv = self.vals[cand]
        d = torch.where(cv >= 0, d, torch.full_like(d, float("inf")))
        top = d.topk(k, dim=-1, largest=False)
        return top.values, torch.gather(cv, 1, top.indices)
