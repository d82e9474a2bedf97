"""The per-step batch (device tensors + pinned ``*_cpu`` mirrors) and the record each replay hook receives."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch


@dataclass
class ForwardBatch:
    mode: str  # "decode" | "extend" | "verify" | "draft"
    input_ids: torch.Tensor
    req_ids: torch.Tensor
    seq_lens: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    adapter_ids: torch.Tensor
    seq_lens_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    extend_lens: Optional[torch.Tensor] = None
    qo_indptr_cpu: Optional[torch.Tensor] = None
    num_tokens: int = 0

    @property
    def batch_size(self) -> int:
        return self.seq_lens_cpu.shape[0]

    @property
    def num_pages(self) -> int:
        return int(self.kv_indptr_cpu[-1])  # ok: FC101

    @classmethod
    def from_host(cls, mode: str, ids: np.ndarray, req_ids: np.ndarray, seq_lens: np.ndarray, pages: List[np.ndarray],
                  adapter_ids: np.ndarray, page_size: int, device: torch.device, extend_lens: Optional[np.ndarray] = None):
        indptr = np.concatenate([[0], np.cumsum([len(p) for p in pages])]).astype(np.int32)
        last = ((seq_lens - 1) % page_size + 1).astype(np.int32)
        qo = None if extend_lens is None else np.concatenate([[0], np.cumsum(extend_lens)]).astype(np.int32)
        return cls(
            mode=mode, input_ids=torch.from_numpy(ids).to(device), req_ids=torch.from_numpy(req_ids).to(device),
            seq_lens=torch.from_numpy(seq_lens).to(device), kv_indices=torch.from_numpy(np.concatenate(pages)).to(device),
            kv_last_page_len=torch.from_numpy(last).to(device), adapter_ids=torch.from_numpy(adapter_ids).to(device),
            seq_lens_cpu=torch.from_numpy(seq_lens).pin_memory(), kv_indptr_cpu=torch.from_numpy(indptr).pin_memory(),
            kv_last_page_len_cpu=torch.from_numpy(last).pin_memory(),
            extend_lens=None if extend_lens is None else torch.from_numpy(extend_lens).to(device),
            qo_indptr_cpu=None if qo is None else torch.from_numpy(qo), num_tokens=len(ids))


class ReplayMeta:
    """Built for every replay and handed to each pre- and post-replay hook."""
    def __init__(self, bs: int, batch: ForwardBatch) -> None:
        self.bs, self.batch = bs, batch
        self.pad_mask = torch.zeros(bs, dtype=torch.bool, device=batch.seq_lens.device)  # ok: FC107
        self.pad_mask[batch.batch_size :] = True
