"""Per-batch metadata: built once for the prefill of a static batch, then once per decode step."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch

from bapi.config import OfflineConfig


@dataclass
class StaticBatchMetadata:
    padded_len: Optional[int]  # None: longer than every padded length, prefilled eagerly
    rows: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    qo_indptr: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    token_req: torch.Tensor
    out_slots: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return int(self.qo_indptr[-1])  # expect: FC101

    @property
    def num_tokens_host(self) -> int:
        return int(self.qo_indptr_cpu[-1])  # ok: FC101


@dataclass
class DecodeMetadata:
    rows: int
    step: int
    kv_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    last_page_len_cpu: torch.Tensor
    seq_lens: torch.Tensor
    positions: torch.Tensor
    out_slots: torch.Tensor
    max_seq_len: int


class StaticBatchMetadataBuilder:
    def __init__(self, cfg: OfflineConfig, device: torch.device):
        self.cfg, self.device = cfg, device
        rows = cfg.batch_rows
        self.row_ids = torch.arange(rows, dtype=torch.int64, device=device)
        self.row_base_slot = self.row_ids * cfg.pages_per_row * cfg.page_size
        self.qo_indptr_pinned = torch.zeros(rows + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_pinned = torch.zeros(rows + 1, dtype=torch.int32, pin_memory=True)
        self.last_len_pinned = torch.zeros(rows, dtype=torch.int32, pin_memory=True)
        self.positions: Optional[torch.Tensor] = None
        self.seq_lens_host = torch.zeros(0, dtype=torch.int32)

    def build(self, ids_np: np.ndarray, lens_np: np.ndarray, padded_len: Optional[int]) -> StaticBatchMetadata:
        rows = lens_np.shape[0]
        q_lens = np.full(rows, padded_len, dtype=np.int32) if padded_len is not None else lens_np
        qo_np = self.qo_indptr_pinned.numpy()
        qo_np[0] = 0
        np.cumsum(q_lens, out=qo_np[1 : rows + 1])
        total = int(qo_np[rows])
        seq_lens_cpu = torch.from_numpy(lens_np)
        seq_lens = seq_lens_cpu.to(self.device, non_blocking=True)
        q_lens_gpu = torch.from_numpy(q_lens).to(self.device, non_blocking=True)
        qo_indptr = self.qo_indptr_pinned[: rows + 1].to(self.device, non_blocking=True)

        token_req = torch.repeat_interleave(self.row_ids[:rows], q_lens_gpu)  # expect: FC101
        starts = torch.repeat_interleave(qo_indptr[:-1].long(), q_lens_gpu, output_size=total)  # ok: FC101
        self.positions = torch.empty(total, dtype=torch.int64, device=self.device)  # expect: FC107
        torch.sub(torch.arange(total, device=self.device), starts, out=self.positions)
        # padded tokens write into the row's own pages too (past its length, overwritten by decode)
        out_slots = self.row_base_slot[token_req] + self.positions
        self.seq_lens_host = torch.cat([self.seq_lens_host, seq_lens_cpu])  # ok: FC107
        input_ids = torch.from_numpy(ids_np[:, : q_lens.max()].reshape(-1)[:total]).to(self.device, non_blocking=True)
        return StaticBatchMetadata(
            padded_len=padded_len, rows=rows, input_ids=input_ids, positions=self.positions, qo_indptr=qo_indptr,
            qo_indptr_cpu=self.qo_indptr_pinned[: rows + 1], seq_lens=seq_lens, seq_lens_cpu=seq_lens_cpu,
            token_req=token_req, out_slots=out_slots,
        )

    def build_decode(self, md: StaticBatchMetadata, step: int) -> DecodeMetadata:
        rows, ps = md.rows, self.cfg.page_size
        lens = md.seq_lens_cpu.numpy() + step + 1
        pages = (lens + ps - 1) // ps
        kv_np = self.kv_indptr_pinned.numpy()
        kv_np[0] = 0
        np.cumsum(pages, out=kv_np[1 : rows + 1])
        self.last_len_pinned.numpy()[:rows] = lens - (pages - 1) * ps
        seq_lens = md.seq_lens + (step + 1)
        return DecodeMetadata(
            rows=rows, step=step, kv_indptr=self.kv_indptr_pinned[: rows + 1].to(self.device, non_blocking=True),
            kv_indptr_cpu=self.kv_indptr_pinned[: rows + 1], last_page_len_cpu=self.last_len_pinned[:rows],
            seq_lens=seq_lens, positions=(seq_lens - 1).long(), out_slots=self.row_base_slot[:rows] + seq_lens - 1,
            max_seq_len=int(lens.max()),
        )
