from dataclasses import dataclass
from typing import List

import torch


@dataclass
class DecodeRequest:
    rid: int
    pages: List[int]
    context_len: int
    last_token: int


@dataclass
class DecodeBatch:
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    last_page_len_cpu: torch.Tensor
    page_ids: torch.Tensor
    token_ids: torch.Tensor

    @property
    def size(self) -> int:
        return self.seq_lens_cpu.shape[0]

    @classmethod
    def from_requests(cls, reqs: List[DecodeRequest], page_size: int, device) -> "DecodeBatch":
        lens = [r.context_len for r in reqs]
        seq_lens_cpu = torch.tensor(lens, dtype=torch.int32)
        pages_per = torch.tensor([(n + page_size - 1) // page_size for n in lens], dtype=torch.int32)
        indptr_cpu = torch.zeros(len(reqs) + 1, dtype=torch.int32)
        indptr_cpu[1:] = torch.cumsum(pages_per, 0)
        last = torch.tensor([(n - 1) % page_size + 1 for n in lens], dtype=torch.int32)
        pages = torch.tensor([p for r in reqs for p in r.pages], dtype=torch.int32)
        return cls(
            seq_lens=seq_lens_cpu.to(device, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu,
            kv_indptr=indptr_cpu.to(device),
            kv_indptr_cpu=indptr_cpu.pin_memory(),
            last_page_len_cpu=last,
            page_ids=pages.to(device),
            token_ids=torch.tensor([r.last_token for r in reqs], dtype=torch.long, device=device),
        )
