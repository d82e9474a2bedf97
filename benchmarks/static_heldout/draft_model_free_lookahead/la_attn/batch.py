"""One step's batch: every row's last accepted token followed by its draft branches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

import numpy as np
import torch

from lookahead import LookaheadConfig


@dataclass
class RowState:
    rid: int
    cached_len: int  # tokens whose K/V are in the cache
    last_token: int  # accepted, not cached yet
    pages: List[int]


@dataclass
class LookaheadBatch:
    num_rows: int
    branches: List[List[List[int]]]
    cached_lens: List[int]
    query_lens_cpu: torch.Tensor
    draft_lens_cpu: torch.Tensor  # first branch: the one acceptance follows
    kv_indptr_cpu: torch.Tensor
    last_page_len_cpu: torch.Tensor
    kv_indices: torch.Tensor
    page_counts: torch.Tensor
    drafts: torch.Tensor  # [n, max_draft], -1 padded
    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    target_index: torch.Tensor  # [n, max_draft + 1] rows of the verify logits each target comes from
    nnz: int

    @property
    def total_drafts(self) -> int:
        return int(self.query_lens_cpu.sum()) - self.num_rows


def build_lookahead_batch(
    rows: List[RowState], branches: List[List[List[int]]], cfg: LookaheadConfig, device: torch.device
) -> LookaheadBatch:
    n, ps = len(rows), cfg.page_size
    q_lens = np.array([1 + sum(len(b) for b in br) for br in branches], dtype=np.int32)
    cached = np.array([r.cached_len for r in rows], dtype=np.int32)
    total = cached + q_lens
    pages = (total + ps - 1) // ps
    qo = np.concatenate(([0], np.cumsum(q_lens)))
    kv = np.concatenate(([0], np.cumsum(pages))).astype(np.int32)
    indices = np.concatenate([r.pages[:p] for r, p in zip(rows, pages)]).astype(np.int32)
    d0 = np.array([len(br[0]) if br else 0 for br in branches], dtype=np.int32)
    drafts = np.full((n, cfg.max_draft), -1, dtype=np.int64)
    target_index = qo[:-1, None] + np.minimum(np.arange(cfg.max_draft + 1)[None, :], d0[:, None])
    ids: List[int] = []
    pos: List[int] = []
    for i, (r, br) in enumerate(zip(rows, branches)):
        ids.append(r.last_token)
        pos.append(r.cached_len)
        for b in br:
            ids.extend(b)
            pos.extend(range(r.cached_len + 1, r.cached_len + 1 + len(b)))
        if br:
            drafts[i, : len(br[0])] = br[0]
    slots = [r.pages[p // ps] * ps + p % ps for r, br in zip(rows, branches) for p in range(r.cached_len, r.cached_len + 1 + sum(map(len, br)))]

    def to_dev(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(device, non_blocking=True)

    return LookaheadBatch(
        num_rows=n,
        branches=branches,
        cached_lens=cached.tolist(),
        query_lens_cpu=torch.from_numpy(q_lens),
        draft_lens_cpu=torch.from_numpy(d0),
        kv_indptr_cpu=torch.from_numpy(kv),
        last_page_len_cpu=torch.from_numpy(((total - 1) % ps + 1).astype(np.int32)),
        kv_indices=to_dev(indices),
        page_counts=to_dev(pages.astype(np.int32)),
        drafts=to_dev(drafts),
        input_ids=to_dev(np.array(ids, dtype=np.int64)),
        positions=to_dev(np.array(pos, dtype=np.int64)),
        slot_mapping=to_dev(np.array(slots, dtype=np.int64)),
        target_index=to_dev(target_index.astype(np.int64)),
        nnz=int(kv[-1]),
    )
