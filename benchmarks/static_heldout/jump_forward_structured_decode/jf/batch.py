"""A mixed step: extend rows (jump-forward runs, new prompts) first, then decode rows."""

from __future__ import annotations

import dataclasses
from typing import List, Optional

import numpy as np
import torch

from .kv import PagedKVPool


@dataclasses.dataclass
class Seq:
    rid: int
    slot: int
    tokens: List[int]
    max_new_tokens: int
    num_computed: int = 0
    prompt_len: int = 0
    finished: bool = False

    @property
    def pending(self) -> int:
        """Tokens not in the KV cache yet: a prompt, a forced run, or the last sample."""
        return len(self.tokens) - self.num_computed


@dataclasses.dataclass
class MixedBatch:
    seqs: List[Seq]
    num_extend: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    batch_indices: torch.Tensor
    qo_indptr: torch.Tensor
    qo_indptr_np: np.ndarray
    kv_indptr: torch.Tensor
    kv_indptr_np: np.ndarray
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    kv_last_page_len_np: np.ndarray
    seq_lens: torch.Tensor
    slots: torch.Tensor
    last_rows: torch.Tensor
    graph_bs: Optional[int] = None

    @property
    def batch_size(self) -> int:
        return int(self.qo_indptr_np.shape[0]) - 1

    @property
    def is_pure_decode(self) -> bool:
        return self.num_extend == 0

    @property
    def all_new_prompts(self) -> bool:
        return self.num_extend == len(self.seqs) and all(s.num_computed == 0 for s in self.seqs)

    @classmethod
    def build(cls, seqs: List[Seq], num_extend: int, pool: PagedKVPool, device: torch.device) -> "MixedBatch":
        ps = pool.page_size
        qo_lens = np.array([s.pending for s in seqs], dtype=np.int32)
        seq_lens = np.array([len(s.tokens) for s in seqs], dtype=np.int32)
        qo = np.zeros(len(seqs) + 1, dtype=np.int32)
        np.cumsum(qo_lens, out=qo[1:])
        n_tokens = int(qo[-1])
        ids = np.concatenate([np.asarray(s.tokens[s.num_computed :], dtype=np.int64) for s in seqs])
        pos = np.concatenate([np.arange(s.num_computed, len(s.tokens), dtype=np.int32) for s in seqs])
        pages = [pool.pages(s.slot) for s in seqs]
        kv_indptr = np.zeros(len(seqs) + 1, dtype=np.int32)
        np.cumsum([len(p) for p in pages], out=kv_indptr[1:])
        last = ((seq_lens - 1) % ps + 1).astype(np.int32)
        qo_lens_dev = torch.from_numpy(qo_lens).to(device, non_blocking=True)
        rows = torch.arange(len(seqs), dtype=torch.int32, device=device)
        return cls(
            seqs=seqs,
            num_extend=num_extend,
            input_ids=torch.from_numpy(ids).to(device, non_blocking=True),
            positions=torch.from_numpy(pos).to(device, non_blocking=True),
            batch_indices=torch.repeat_interleave(rows, qo_lens_dev, output_size=n_tokens),  # ok: FC101
            qo_indptr=torch.from_numpy(qo).to(device, non_blocking=True),
            qo_indptr_np=qo,
            kv_indptr=torch.from_numpy(kv_indptr).to(device, non_blocking=True),
            kv_indptr_np=kv_indptr,
            kv_indices=torch.from_numpy(np.concatenate(pages).astype(np.int32)).to(device, non_blocking=True),
            kv_last_page_len=torch.from_numpy(last).to(device, non_blocking=True),
            kv_last_page_len_np=last,
            seq_lens=torch.from_numpy(seq_lens).to(device, non_blocking=True),
            slots=torch.tensor([s.slot for s in seqs], dtype=torch.int64, device=device),
            last_rows=torch.from_numpy(qo[1:].astype(np.int64) - 1).to(device, non_blocking=True),
        )
