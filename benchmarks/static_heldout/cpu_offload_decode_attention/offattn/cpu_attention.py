"""Decode attention over host pages, on the CPU. Returns the output and a base-2 LSE like FlashInfer's."""

from __future__ import annotations

import math
from typing import List, Tuple

import torch


def cpu_decode_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, tables: List[List[int]],
                         sm_scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
    assert q.shape[0] == len(tables)  # expect: FC109
    n, nq, hd = q.shape
    nkv = k_pages.shape[2]
    group = nq // nkv
    o = torch.zeros(n, nq, hd, dtype=torch.float32)
    lse = torch.full((n, nq), -float("inf"), dtype=torch.float32)
    for i, pages in enumerate(tables):
        if not pages:
            continue
        idx = torch.tensor(pages, dtype=torch.long)
        k = k_pages.index_select(0, idx).reshape(-1, nkv, hd).float()
        v = v_pages.index_select(0, idx).reshape(-1, nkv, hd).float()
        qi = q[i].float().view(nkv, group, hd)
        s = torch.einsum("kgd,lkd->kgl", qi, k) * sm_scale
        m = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - m.unsqueeze(-1))
        o[i] = torch.einsum("kgl,lkd->kgd", p, v).reshape(nq, hd)
        lse[i] = m.reshape(nq) / math.log(2.0)
    return o, lse
