"""Per-step batches and the FlashInfer metadata built from the scheduler's host arrays."""

from dataclasses import dataclass
from typing import Optional, Union

import numpy as np
import torch

from mfserve.config import MInferenceConfig


@dataclass
class StepBatch:
    is_prefill: bool
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_np: np.ndarray
    page_table_np: np.ndarray
    extend_lens_np: Optional[np.ndarray] = None
    long_rows: Optional[torch.Tensor] = None


@dataclass
class DecodeMeta:
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_cpu: torch.Tensor
    last_page_len_device: torch.Tensor
    long_indptr_cpu: torch.Tensor
    long_indices: torch.Tensor
    long_last_cpu: torch.Tensor
    num_long: int


@dataclass
class PrefillMeta:
    qo_indptr: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_cpu: torch.Tensor
    max_q_len: int


StepMeta = Union[DecodeMeta, PrefillMeta]


class MInferenceMetadataBuilder:
    def __init__(self, cfg: MInferenceConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        n = cfg.max_batch + 1
        self.indptr_pinned = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        self.qo_pinned = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        self.last_pinned = torch.zeros(cfg.max_batch, dtype=torch.int32, pin_memory=True)
        self.long_indptr_pinned = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        self.long_last_pinned = torch.zeros(cfg.max_batch, dtype=torch.int32, pin_memory=True)
        self.indices_pinned = torch.zeros(cfg.max_pages, dtype=torch.int32, pin_memory=True)
        self.long_indices_pinned = torch.zeros(cfg.max_pages, dtype=torch.int32, pin_memory=True)
        self.indptr_np = self.indptr_pinned.numpy()
        self.qo_np = self.qo_pinned.numpy()
        self.last_np = self.last_pinned.numpy()
        self.long_indptr_np = self.long_indptr_pinned.numpy()
        self.long_last_np = self.long_last_pinned.numpy()
        self.indices_np = self.indices_pinned.numpy()
        self.long_indices_np = self.long_indices_pinned.numpy()
        self.indices_dev = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.long_indices_dev = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)

    def _paged(self, bs: int, seq_lens_np: np.ndarray, page_table_np: np.ndarray) -> int:
        ps = self.cfg.page_size
        pages = (seq_lens_np + ps - 1) // ps
        self.indptr_np[0] = 0
        np.cumsum(pages, out=self.indptr_np[1 : bs + 1])
        for i in range(bs):
            self.indices_np[self.indptr_np[i] : self.indptr_np[i + 1]] = page_table_np[i, : pages[i]]
        self.last_np[:bs] = seq_lens_np - (pages - 1) * ps
        return int(self.indptr_np[bs])

    def build(self, batch: StepBatch) -> StepMeta:
        bs = batch.batch_size
        nnz = self._paged(bs, batch.seq_lens_np, batch.page_table_np)
        self.indices_dev[:nnz].copy_(self.indices_pinned[:nnz], non_blocking=True)
        if not batch.is_prefill:
            return self._build_decode(batch, nnz)
        if (batch.extend_lens_np > self.cfg.max_num_tokens).any():  # ok: FC101
            raise ValueError(f"chunk of {int(batch.extend_lens_np.max())} tokens over max_num_tokens")
        self.qo_np[0] = 0
        np.cumsum(batch.extend_lens_np, out=self.qo_np[1 : bs + 1])
        return PrefillMeta(
            qo_indptr=self.qo_pinned[: bs + 1].to(self.device, non_blocking=True),
            qo_indptr_cpu=self.qo_pinned[: bs + 1],
            kv_indptr_cpu=self.indptr_pinned[: bs + 1],
            kv_indices=self.indices_dev[:nnz],
            last_page_len_cpu=self.last_pinned[:bs],
            max_q_len=int(batch.extend_lens_np.max()),
        )

    def _build_decode(self, batch: StepBatch, nnz: int) -> DecodeMeta:
        bs = batch.batch_size
        long_rows = np.flatnonzero(batch.seq_lens_np > self.cfg.long_ctx_len)
        nl = len(long_rows)
        self.long_indptr_np[0] = 0
        pos = 0
        for j, r in enumerate(long_rows):
            a, b = self.indptr_np[r], self.indptr_np[r + 1]
            self.long_indices_np[pos : pos + b - a] = self.indices_np[a:b]
            pos += b - a
            self.long_indptr_np[j + 1] = pos
            self.long_last_np[j] = self.last_np[r]
        self.long_indices_dev[:pos].copy_(self.long_indices_pinned[:pos], non_blocking=True)
        return DecodeMeta(
            kv_indptr_cpu=self.indptr_pinned[: bs + 1],
            kv_indices=self.indices_dev[:nnz],
            last_page_len_cpu=self.last_pinned[:bs],
            last_page_len_device=self.last_pinned[:bs].to(self.device, non_blocking=True),
            long_indptr_cpu=self.long_indptr_pinned[: nl + 1],
            long_indices=self.long_indices_dev[:pos],
            long_last_cpu=self.long_last_pinned[:nl],
            num_long=nl,
        )
