"""Per-step decode batch of one tier and the prefill batch a migration builds on the large tier."""

from __future__ import annotations

import dataclasses
from typing import List, Optional

import numpy as np
import torch

from cascade.kvpool import TierKVPool
from cascade.requests import Request


@dataclasses.dataclass
class TierBatch:
    batch_size: int
    slots: torch.Tensor
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: Optional[np.ndarray]
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len: torch.Tensor
    last_page_len_cpu: torch.Tensor
    out_loc: torch.Tensor
    escalated: Optional[torch.Tensor] = None

    @classmethod
    def build(cls, reqs: List[Request], pool: TierKVPool, device: torch.device) -> "TierBatch":
        ps = pool.page_size
        seq = np.array([r.num_tokens for r in reqs], dtype=np.int32)
        pages = (seq + ps - 1) // ps
        indptr = np.zeros(len(reqs) + 1, dtype=np.int32)
        np.cumsum(pages, out=indptr[1:])
        indices = np.concatenate([pool.page_table_np[r.slot, :p] for r, p in zip(reqs, pages)])
        last = (seq - (pages - 1) * ps).astype(np.int32)
        loc = np.array([pool.page_table_np[r.slot, (s - 1) // ps] * ps + (s - 1) % ps for r, s in zip(reqs, seq)],
                       dtype=np.int64)
        last_tok = [r.output_ids[-1] if r.output_ids else r.prompt_ids[-1] for r in reqs]
        return cls(
            batch_size=len(reqs),
            slots=torch.tensor([r.slot for r in reqs], dtype=torch.int64, device=device),
            input_ids=torch.tensor(last_tok, dtype=torch.int64, device=device),
            positions=torch.from_numpy(seq.astype(np.int64) - 1).to(device, non_blocking=True),
            seq_lens=torch.from_numpy(seq).to(device, non_blocking=True),
            seq_lens_cpu=seq,
            kv_indptr_cpu=torch.from_numpy(indptr),
            kv_indices=torch.from_numpy(indices).to(device, non_blocking=True),
            last_page_len=torch.from_numpy(last).to(device, non_blocking=True),
            last_page_len_cpu=torch.from_numpy(last),
            out_loc=torch.from_numpy(loc).to(device, non_blocking=True),
        )


@dataclasses.dataclass
class PrefillBatch:
    batch_size: int
    qo_indptr: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    out_loc: torch.Tensor
    max_q_len: int
    use_trtllm_context: bool
