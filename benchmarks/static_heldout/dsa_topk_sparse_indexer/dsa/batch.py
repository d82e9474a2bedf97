"""Per-step batches: host numpy views first, device copies made from them."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, List, Optional

import numpy as np
import torch

if TYPE_CHECKING:
    from .kv_cache import MLATokenPool


@dataclasses.dataclass
class Request:
    rid: int
    pool_idx: int
    prompt_ids: List[int]
    max_new_tokens: int = 256
    output_ids: List[int] = dataclasses.field(default_factory=list)

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def last_token(self) -> int:
        return (self.output_ids or self.prompt_ids)[-1]

    @property
    def finished(self) -> bool:
        return len(self.output_ids) >= self.max_new_tokens


@dataclasses.dataclass
class DecodeBatch:
    reqs: List[Request]
    req_pool_indices: torch.Tensor
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    sparse_lens: torch.Tensor
    graph_bs: Optional[int] = None

    @property
    def batch_size(self) -> int:
        return int(self.seq_lens_cpu.shape[0])

    @classmethod
    def from_requests(
        cls, reqs: List[Request], topk: int, pool: "MLATokenPool", device: torch.device
    ) -> "DecodeBatch":
        n = len(reqs)
        lens_np = np.fromiter((r.seq_len for r in reqs), dtype=np.int32, count=n)
        ids_np = np.fromiter((r.last_token for r in reqs), dtype=np.int64, count=n)
        pool_np = np.fromiter((r.pool_idx for r in reqs), dtype=np.int64, count=n)
        loc_np = np.empty(n, dtype=np.int64)
        for i, r in enumerate(reqs):
            pool.ensure_pages(r.pool_idx, r.seq_len)
            loc_np[i] = pool.slots_for(r.pool_idx, r.seq_len - 1, 1)[0]
        seq_lens_cpu = torch.from_numpy(lens_np).pin_memory()
        seq_lens = seq_lens_cpu.to(device, non_blocking=True)
        return cls(
            reqs=reqs,
            req_pool_indices=torch.from_numpy(pool_np).to(device, non_blocking=True),
            input_ids=torch.from_numpy(ids_np).to(device, non_blocking=True),
            positions=(seq_lens - 1).long(),
            out_cache_loc=torch.from_numpy(loc_np).to(device, non_blocking=True),
            seq_lens=seq_lens,
            seq_lens_cpu=seq_lens_cpu,
            sparse_lens=torch.clamp(seq_lens, max=topk),
        )


@dataclasses.dataclass
class ExtendBatch:
    """Prompts minus their last token; the last one is the first decode input."""

    reqs: List[Request]
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    qo_indptr: torch.Tensor
    qo_indptr_np: np.ndarray

    @property
    def num_tokens(self) -> int:
        return int(self.qo_indptr_np[-1])

    @classmethod
    def from_requests(cls, reqs: List[Request], pool: "MLATokenPool", device) -> "ExtendBatch":
        lens = np.array([len(r.prompt_ids) - 1 for r in reqs], dtype=np.int32)
        indptr_np = np.zeros(len(reqs) + 1, dtype=np.int32)
        np.cumsum(lens, out=indptr_np[1:])
        ids = np.concatenate([np.asarray(r.prompt_ids[:-1], dtype=np.int64) for r in reqs])
        pos = np.concatenate([np.arange(n, dtype=np.int64) for n in lens])
        slots = []
        for r, n in zip(reqs, lens):
            pool.ensure_pages(r.pool_idx, int(n) + 1)
            slots.append(pool.slots_for(r.pool_idx, 0, int(n)))
        return cls(
            reqs=reqs,
            input_ids=torch.from_numpy(ids).to(device, non_blocking=True),
            positions=torch.from_numpy(pos).to(device, non_blocking=True),
            out_cache_loc=torch.from_numpy(np.concatenate(slots)).to(device, non_blocking=True),
            qo_indptr=torch.from_numpy(indptr_np).to(device),
            qo_indptr_np=indptr_np,
        )
