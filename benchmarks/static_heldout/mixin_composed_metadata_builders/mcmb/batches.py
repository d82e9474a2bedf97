"""Scheduled batches (one class per kind, dispatched on by the builders) and the metadata built for them."""
from __future__ import annotations

import dataclasses
from typing import List, Optional

import numpy as np
import torch

from mcmb.config import PAGE_SIZE


@dataclasses.dataclass
class BatchBase:
    req_ids: List[int]
    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    block_table: torch.Tensor
    block_table_np: np.ndarray
    prefix_lens: Optional[torch.Tensor] = None  # tokens of a system prompt the batch shares

    @property
    def num_seqs(self) -> int:
        return len(self.req_ids)

    @property
    def max_kv_len(self) -> int:
        return max(int(n) for n in self.seq_lens)  # expect: FC101

    @property
    def max_kv_len_host(self) -> int:
        return int(self.seq_lens_cpu.max())  # ok: FC101


@dataclasses.dataclass
class DecodeBatch(BatchBase):
    last_page_len_gpu: Optional[torch.Tensor] = None


@dataclasses.dataclass
class PrefillBatch(BatchBase):
    qo_indptr: Optional[torch.Tensor] = None
    qo_indptr_np: Optional[np.ndarray] = None


@dataclasses.dataclass
class MixedBatch(PrefillBatch):
    query_lens: Optional[torch.Tensor] = None
    query_lens_cpu: Optional[torch.Tensor] = None


@dataclasses.dataclass
class AttnMetadata:
    kind: str
    num_seqs: int
    num_tokens: int
    graph_bs: Optional[int] = None
    num_decodes: int = 0
    kv_indptr_gpu: Optional[torch.Tensor] = None


def upload(a: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(a).pin_memory().to(device, non_blocking=True)


def decode_batch(req_ids: List[int], ids, positions, slots, seq_lens: np.ndarray, block_table: np.ndarray,
                 device: torch.device, prefix_len: int = 0) -> DecodeBatch:
    last = seq_lens - ((seq_lens + PAGE_SIZE - 1) // PAGE_SIZE - 1) * PAGE_SIZE
    prefix = upload(np.full(len(req_ids), prefix_len, dtype=np.int32), device) if prefix_len else None
    return DecodeBatch(
        req_ids=req_ids, input_ids=upload(ids, device), positions=upload(positions, device),
        slot_mapping=upload(slots, device), seq_lens=upload(seq_lens, device), seq_lens_cpu=torch.from_numpy(seq_lens),
        block_table=upload(block_table, device), block_table_np=block_table, prefix_lens=prefix,
        last_page_len_gpu=upload(last.astype(np.int32), device))


def prefill_batch(req_ids: List[int], ids, positions, slots, seq_lens: np.ndarray, block_table: np.ndarray,
                  qo_indptr: np.ndarray, device: torch.device) -> PrefillBatch:
    q_lens = np.diff(qo_indptr).astype(np.int32)
    ids_d, pos_d, slots_d = upload(ids, device), upload(positions, device), upload(slots, device)
    lens_d, table_d, qo_d = upload(seq_lens, device), upload(block_table, device), upload(qo_indptr, device)
    lens_cpu = torch.from_numpy(seq_lens)
    if (q_lens > 1).all():
        return PrefillBatch(req_ids, ids_d, pos_d, slots_d, lens_d, lens_cpu, table_d, block_table,
                            qo_indptr=qo_d, qo_indptr_np=qo_indptr)
    return MixedBatch(req_ids, ids_d, pos_d, slots_d, lens_d, lens_cpu, table_d, block_table, qo_indptr=qo_d,
                      qo_indptr_np=qo_indptr, query_lens=upload(q_lens, device), query_lens_cpu=torch.from_numpy(q_lens))
