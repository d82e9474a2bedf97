"""Per-step decode metadata, built once per KV class per step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
import torch

from qswitch.config import SwitchConfig
from qswitch.dtypes import KVClass
from qswitch.pool import QuantKVPool


@dataclass
class DecodeMetadata:
    kv_class: KVClass
    batch_size: int
    seq_lens_cpu: torch.Tensor
    seq_lens_gpu: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_cpu: torch.Tensor
    block_tables: torch.Tensor
    # rows whose pages were requantized this step (their per-page scales changed)
    rescaled_rows: torch.Tensor
    qo_indptr: Optional[torch.Tensor] = None
    page_owner: Optional[torch.Tensor] = None
    stats: Dict[str, int] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return int(self.seq_lens_cpu.sum())  # ok: FC101

    @property
    def num_rescaled(self) -> int:
        return int(self.rescaled_rows.sum())  # expect: FC101

    @property
    def max_seq_len(self) -> int:
        return int(self.seq_lens_cpu.max())


class DecodeMetadataBuilder:
    def __init__(self, cfg: SwitchConfig, pool: QuantKVPool, device: torch.device):
        self.cfg = cfg
        self.pool = pool
        self.device = device
        self.rescale_flags = torch.zeros(cfg.max_requests, dtype=torch.bool, device=device)

    def _dev(self, t: torch.Tensor) -> torch.Tensor:
        return t.pin_memory().to(self.device, non_blocking=True)

    def build(self, kv_class: KVClass, rids: List[str], rows: np.ndarray) -> DecodeMetadata:
        indptr, flat, last, lens = self.pool.tables(rids)
        indptr_cpu = torch.tensor(indptr, dtype=torch.int32)
        seq_lens_cpu = torch.tensor(lens, dtype=torch.int32)
        width = int(np.diff(indptr).max())
        meta = DecodeMetadata(
            kv_class=kv_class,
            batch_size=len(rids),
            seq_lens_cpu=seq_lens_cpu,
            seq_lens_gpu=self._dev(seq_lens_cpu),
            kv_indptr=self._dev(indptr_cpu),
            kv_indptr_cpu=indptr_cpu,
            kv_indices=self._dev(torch.tensor(flat, dtype=torch.int32)),
            last_page_len_cpu=torch.tensor(last, dtype=torch.int32),
            block_tables=self._dev(torch.tensor(self.pool.block_table(rids, width), dtype=torch.int32)),
            rescaled_rows=self.rescale_flags.index_select(0, self._dev(torch.tensor(rows, dtype=torch.int64))),
        )
        meta.qo_indptr = torch.arange(meta.batch_size + 1, dtype=torch.int32, device=self.device)  # ok: FC107
        # owner row of every page, for the per-page scale gather of the fp8 kernels
        row_ids = torch.arange(meta.batch_size, dtype=torch.int32, device=self.device)
        counts = torch.diff(meta.kv_indptr)
        meta.page_owner = torch.repeat_interleave(row_ids, counts, output_size=int(indptr[-1]))  # ok: FC101
        meta.stats["tokens"] = meta.num_tokens
        if kv_class is KVClass.FP8 and meta.num_rescaled > 0:
            meta.stats["rescaled"] = 1
        return meta
