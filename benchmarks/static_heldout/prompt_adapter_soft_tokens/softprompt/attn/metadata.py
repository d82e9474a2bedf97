"""Per-step metadata of the soft-prompt server."""

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ..slot_table import EmbeddingSlotTable


@dataclass
class SoftBatch:
    """Host-side batch the scheduler hands to the step (numpy only)."""

    bs: int
    is_decode: bool
    input_ids_np: np.ndarray
    adapter_ids_np: np.ndarray
    virtual_lens_np: np.ndarray
    q_lens_np: np.ndarray
    qo_indptr_np: np.ndarray
    kv_indptr_np: np.ndarray
    kv_indices_np: np.ndarray
    last_page_len_np: np.ndarray
    soft_mask_np: np.ndarray
    finished_rows_np: np.ndarray


@dataclass
class StepMetadata:
    bs: int
    num_tokens: int
    is_decode: bool
    qo_indptr: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    soft_mask: Optional[torch.Tensor] = None
    soft_slots: Optional[torch.Tensor] = None
    soft_offsets: Optional[torch.Tensor] = None


class StepMetaBuilder:
    def __init__(self, table: EmbeddingSlotTable, device) -> None:
        self.table = table
        self.device = device

    def make(self, batch: SoftBatch) -> StepMetadata:
        qo_indptr_cpu = torch.from_numpy(batch.qo_indptr_np)
        kv_indptr_cpu = torch.from_numpy(batch.kv_indptr_np)
        meta = StepMetadata(
            bs=batch.bs,
            num_tokens=int(batch.qo_indptr_np[-1]),
            is_decode=batch.is_decode,
            qo_indptr=qo_indptr_cpu.to(self.device, non_blocking=True),
            qo_indptr_cpu=qo_indptr_cpu,
            kv_indptr=kv_indptr_cpu.to(self.device, non_blocking=True),
            kv_indptr_cpu=kv_indptr_cpu,
            kv_indices=torch.from_numpy(batch.kv_indices_np).to(self.device, non_blocking=True),
            kv_last_page_len_cpu=torch.from_numpy(batch.last_page_len_np),
        )
        if not batch.is_decode:
            q_lens = torch.from_numpy(batch.q_lens_np).to(self.device, non_blocking=True)
            slots = self._soft_token_slots(batch.bs, q_lens, meta.num_tokens)
            offsets = self._soft_token_offsets(q_lens)
            meta.soft_mask = torch.from_numpy(batch.soft_mask_np).to(self.device, non_blocking=True)
            meta.soft_slots = torch.where(meta.soft_mask, slots, 0)
            meta.soft_offsets = torch.where(meta.soft_mask, offsets, 0)
        return meta

    def _soft_token_slots(self, bs: int, q_lens: torch.Tensor, num_tokens: int) -> torch.Tensor:
        # every token of a row carries the row's slot; the soft mask keeps the first virtual_len of them
        return torch.repeat_interleave(self.table.row_slots[:bs], q_lens, output_size=num_tokens)  # ok: FC101

    def _soft_token_offsets(self, q_lens: torch.Tensor) -> torch.Tensor:
        # offset of each token inside its row: the soft tokens come first, in adapter order
        starts = torch.cumsum(q_lens, 0) - q_lens
        row_start = torch.repeat_interleave(starts, q_lens)  # expect: FC101
        return torch.arange(row_start.shape[0], device=q_lens.device) - row_start
