"""Per-step metadata for a batch of branch leaves: full page tables for the decode graphs,
a trunk / suffix split for the cascade, and the copy-on-write of shared last pages."""
from dataclasses import dataclass
from itertools import chain
from typing import List, Optional, Tuple

import numpy as np
import torch

from convtree import ChatServerConfig, PagePool, branch_offsets


@dataclass
class TreeBatch:
    leaves: List[Tuple[str, int]]
    input_ids_cpu: torch.Tensor
    q_lens_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    page_tables: List[List[int]]
    trunk_pages: List[int]
    leaf_ids_cpu: torch.Tensor

    @property
    def num_rows(self) -> int:
        return len(self.leaves)


@dataclass
class TreeStepMeta:
    num_rows: int
    num_tokens: int
    num_pages: int
    max_seq_len: int
    use_cascade: bool
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    last_page_len_cpu: torch.Tensor
    kv_indices: torch.Tensor
    positions: torch.Tensor
    batch_indices: torch.Tensor
    leaf_ids_cpu: torch.Tensor
    cow_from: Optional[torch.Tensor] = None
    cow_to: Optional[torch.Tensor] = None
    block_tables: Optional[torch.Tensor] = None
    seq_lens: Optional[torch.Tensor] = None
    trunk_kv_indptr_cpu: Optional[torch.Tensor] = None
    trunk_kv_indices: Optional[torch.Tensor] = None
    suffix_kv_indptr: Optional[torch.Tensor] = None
    suffix_kv_indices: Optional[torch.Tensor] = None


class BranchMetadataBuilder:
    def __init__(self, cfg: ChatServerConfig, pool: PagePool, device: torch.device):
        self.cfg, self.pool, self.device = cfg, pool, device
        r, cap = cfg.max_rows, cfg.max_rows * cfg.pages_per_row
        self.qo_indptr_cpu = torch.zeros(r + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_cpu = torch.zeros(r + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_cpu = torch.zeros(r, dtype=torch.int32, pin_memory=True)
        self.indices_cpu = torch.zeros(cap, dtype=torch.int32, pin_memory=True)
        self.block_tables_cpu = torch.zeros(r, cfg.pages_per_row, dtype=torch.int32, pin_memory=True)
        self.kv_indices = torch.zeros(cap, dtype=torch.int32, device=device)
        self.suffix_indices = torch.zeros(cap, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(r, cfg.pages_per_row, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(r, dtype=torch.int32, device=device)
        self.row_ids = torch.arange(r, dtype=torch.int32, device=device)
        self.arange = torch.arange(cfg.max_tokens_per_step, dtype=torch.int64, device=device)
        # one spare page per row for copy-on-write; the server refills the ones a step used
        self.spare_pages = torch.tensor(pool.alloc(r), dtype=torch.int32, device=device)

    def build(self, batch: TreeBatch) -> TreeStepMeta:
        n, ps = batch.num_rows, self.cfg.page_size
        q, s = batch.q_lens_cpu.numpy(), batch.seq_lens_cpu.numpy()
        num_tokens = int(batch.q_lens_cpu.sum())  # ok: FC101
        qo = self.qo_indptr_cpu.numpy()
        qo[0] = 0
        np.cumsum(q, out=qo[1 : n + 1])
        kv = self.kv_indptr_cpu.numpy()
        kv[0] = 0
        np.cumsum([len(t) for t in batch.page_tables], dtype=np.int32, out=kv[1 : n + 1])
        self.last_page_len_cpu.numpy()[:n] = (s - 1) % ps + 1
        num_pages = int(kv[n])
        self.indices_cpu.numpy()[:num_pages] = np.fromiter(chain.from_iterable(batch.page_tables), np.int32, num_pages)
        bt = self.block_tables_cpu.numpy()
        for r, table in enumerate(batch.page_tables):
            bt[r, : len(table)] = table
        self.kv_indices[:num_pages].copy_(self.indices_cpu[:num_pages], non_blocking=True)
        self.block_tables[:n].copy_(self.block_tables_cpu[:n], non_blocking=True)
        self.seq_lens[:n].copy_(batch.seq_lens_cpu, non_blocking=True)

        # copy-on-write: a row whose last page a sibling branch still holds appends into its spare page
        last_slot = torch.from_numpy(kv[1 : n + 1] - 1).to(self.device, non_blocking=True).long()
        last_pages = self.kv_indices[last_slot]
        shared = self.pool.refcount_gpu[last_pages.long()] > 1
        cow_to = torch.where(shared, self.spare_pages[:n], last_pages)  # ok: FC101
        cow_src = last_pages[shared]  # expect: FC101
        self.pool.refcount_gpu.index_add_(0, cow_src.long(), torch.full_like(cow_src, -1))
        self.kv_indices[last_slot] = cow_to

        q_lens_gpu = batch.q_lens_cpu.to(self.device, non_blocking=True)
        batch_indices = torch.repeat_interleave(self.row_ids[:n], q_lens_gpu)  # expect: FC101
        base = torch.from_numpy(s - q - qo[:n]).to(self.device, non_blocking=True)
        positions = torch.repeat_interleave(base, q_lens_gpu, output_size=num_tokens) + self.arange[:num_tokens]  # ok: FC101

        meta = TreeStepMeta(
            num_rows=n, num_tokens=num_tokens, num_pages=num_pages, max_seq_len=int(s.max()),
            use_cascade=n > 1 and len(batch.trunk_pages) > 0,
            qo_indptr_cpu=self.qo_indptr_cpu[: n + 1], kv_indptr_cpu=self.kv_indptr_cpu[: n + 1],
            last_page_len_cpu=self.last_page_len_cpu[:n], kv_indices=self.kv_indices[:num_pages],
            positions=positions, batch_indices=batch_indices, leaf_ids_cpu=batch.leaf_ids_cpu,
            cow_from=last_pages, cow_to=cow_to, block_tables=self.block_tables[:n], seq_lens=self.seq_lens[:n],
        )
        if meta.use_cascade:
            trunk = len(batch.trunk_pages)
            suffix_lens = (kv[1 : n + 1] - kv[:n] - trunk).astype(np.int32)
            suffix = np.concatenate([np.asarray(t[trunk:], dtype=np.int32) for t in batch.page_tables])
            self.suffix_indices[: suffix.shape[0]].copy_(torch.from_numpy(suffix), non_blocking=True)
            meta.trunk_kv_indptr_cpu = torch.tensor([0, trunk], dtype=torch.int32)
            meta.trunk_kv_indices = self.kv_indices[:trunk]
            meta.suffix_kv_indptr = branch_offsets(torch.from_numpy(suffix_lens).to(self.device), n)
            meta.suffix_kv_indices = self.suffix_indices[: suffix.shape[0]]
        return meta
