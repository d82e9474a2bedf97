from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

import numpy as np
import torch


@dataclass
class StepBatch:
    """One step of one model: built on the host, copied to the device once."""

    model_id: str
    req_ids: List[int]
    is_decode: bool
    num_tokens: int
    input_ids: torch.Tensor          # device
    positions: torch.Tensor          # device
    seq_lens: torch.Tensor           # device
    seq_lens_cpu: torch.Tensor       # pinned
    num_pages: torch.Tensor          # device, pages per request
    num_pages_cpu: np.ndarray
    page_ids: torch.Tensor           # device, flattened page ids of the batch
    last_page_len_cpu: torch.Tensor  # pinned
    qo_indptr_cpu: torch.Tensor      # pinned

    @classmethod
    def from_requests(cls, model_id: str, reqs: Sequence["Request"], page_size: int,
                      device: torch.device) -> "StepBatch":
        is_decode = all(r.num_computed > 0 for r in reqs)
        new_tokens = [1 if is_decode else len(r.prompt) - r.num_computed for r in reqs]
        seq_lens_np = np.array([r.num_computed + n for r, n in zip(reqs, new_tokens)], dtype=np.int32)
        pages_np = (seq_lens_np + page_size - 1) // page_size
        last_np = seq_lens_np - (pages_np - 1) * page_size
        qo_np = np.zeros(len(reqs) + 1, dtype=np.int32)
        np.cumsum(new_tokens, out=qo_np[1:])
        flat_pages = np.concatenate([np.asarray(r.pages[:p], dtype=np.int32) for r, p in zip(reqs, pages_np)])
        ids = np.concatenate([r.next_input_ids(n) for r, n in zip(reqs, new_tokens)]).astype(np.int64)
        pos = np.concatenate([np.arange(r.num_computed, r.num_computed + n) for r, n in zip(reqs, new_tokens)])

        seq_lens_cpu = torch.from_numpy(seq_lens_np).pin_memory()
        return cls(
            model_id=model_id,
            req_ids=[r.rid for r in reqs],
            is_decode=is_decode,
            num_tokens=int(qo_np[-1]),
            input_ids=torch.from_numpy(ids).to(device, non_blocking=True),
            positions=torch.from_numpy(pos).to(device, non_blocking=True),
            seq_lens=seq_lens_cpu.to(device, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu,
            num_pages=torch.from_numpy(pages_np).to(device, non_blocking=True),
            num_pages_cpu=pages_np,
            page_ids=torch.from_numpy(flat_pages).to(device, non_blocking=True),
            last_page_len_cpu=torch.from_numpy(last_np).pin_memory(),
            qo_indptr_cpu=torch.from_numpy(qo_np).pin_memory(),
        )


class Request:
    def __init__(self, rid: int, model_id: str, prompt: List[int], pages: List[int]):
        self.rid = rid
        self.model_id = model_id
        self.prompt = prompt
        self.pages = pages
        self.output: List[int] = []
        self.num_computed = 0

    def next_input_ids(self, n: int) -> np.ndarray:
        if self.num_computed == 0:
            return np.asarray(self.prompt[:n])
        return np.asarray([self.output[-1] if self.output else self.prompt[-1]])
