from dataclasses import dataclass
from typing import List, Sequence

import numpy as np
import torch


@dataclass
class Request:
    req_id: int
    last_token: int
    seq_len: int
    pages: List[int]


@dataclass
class DecodeBatch:
    req_ids: List[int]
    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    page_table_cpu: np.ndarray

    @property
    def size(self) -> int:
        return len(self.req_ids)


@dataclass
class PaddedView:
    batch: DecodeBatch
    bucket: int

    @property
    def num_active(self) -> int:
        return int((self.batch.seq_lens > 0).sum())  # expect: FC101


def make_decode_batch(reqs: Sequence[Request], page_size: int, max_pages: int, device: torch.device) -> DecodeBatch:
    seq_lens_cpu = torch.tensor([r.seq_len for r in reqs], dtype=torch.int32)
    table = np.zeros((len(reqs), max_pages), dtype=np.int32)
    slots = []
    for i, r in enumerate(reqs):
        table[i, : len(r.pages)] = r.pages
        pos = r.seq_len - 1
        slots.append(r.pages[pos // page_size] * page_size + pos % page_size)
    ids_cpu = torch.tensor([r.last_token for r in reqs], dtype=torch.long)
    return DecodeBatch(
        req_ids=[r.req_id for r in reqs], input_ids=ids_cpu.to(device, non_blocking=True),
        positions=(seq_lens_cpu - 1).long().to(device, non_blocking=True),
        slot_mapping=torch.tensor(slots, dtype=torch.long).to(device, non_blocking=True),
        seq_lens=seq_lens_cpu.to(device, non_blocking=True), seq_lens_cpu=seq_lens_cpu, page_table_cpu=table)


def last_page_lens(seq_lens: torch.Tensor, page_size: int) -> torch.Tensor:
    return (seq_lens - 1) % page_size + 1
