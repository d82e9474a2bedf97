"""Offline: build an IVF datastore from (hidden state, next token) pairs dumped by a forward pass."""
from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)


def kmeans(x: torch.Tensor, n_lists: int, iters: int = 20) -> torch.Tensor:
    cent = x[torch.randperm(x.shape[0], device=x.device)[:n_lists]].clone()
    for it in range(iters):
        assign = torch.cdist(x, cent).argmin(-1)
        cent.zero_().index_add_(0, assign, x)
        counts = torch.bincount(assign, minlength=n_lists).clamp_min(1)
        cent /= counts.unsqueeze(-1)
        empty = (counts == 1).sum().item()  # ok: FC101
        logger.info("kmeans iter %d: %d near-empty lists", it, empty)
    return cent


def build_padded_lists(x: torch.Tensor, vals: torch.Tensor, cent: torch.Tensor, list_cap: int):
    assign = torch.cdist(x, cent).argmin(-1)
    keys = torch.zeros(cent.shape[0] * list_cap, x.shape[1], dtype=torch.float16, device=x.device)
    out_vals = torch.full((cent.shape[0] * list_cap,), -1, dtype=torch.int64, device=x.device)
    for c in range(cent.shape[0]):
        members = (assign == c).nonzero().squeeze(-1)[:list_cap]
        keys[c * list_cap : c * list_cap + members.numel()] = x[members].half()
        out_vals[c * list_cap : c * list_cap + members.numel()] = vals[members]
    return keys, out_vals
