"""Per-step batch classes; ``build_metadata`` and ``prepare_graph_inputs`` dispatch on them."""
import dataclasses
import itertools
from typing import List, Sequence

import torch

from .config import PAGE_SIZE


@dataclasses.dataclass
class Request:
    seq_len: int
    page_ids: List[int]
    last_token: int


@dataclasses.dataclass
class DecodeBatch:
    input_ids: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor

    @classmethod
    def from_requests(cls, reqs: Sequence[Request], device: torch.device) -> "DecodeBatch":
        assert len(reqs) > 0, "empty decode batch"  # expect: FC109
        lens = torch.tensor([r.seq_len for r in reqs], dtype=torch.int32).pin_memory()
        indptr = torch.tensor([0, *itertools.accumulate(len(r.page_ids) for r in reqs)], dtype=torch.int32).pin_memory()
        last = torch.tensor([(r.seq_len - 1) % PAGE_SIZE + 1 for r in reqs], dtype=torch.int32).pin_memory()
        ids = torch.tensor([r.last_token for r in reqs], dtype=torch.int64, device=device)
        pages = torch.tensor([p for r in reqs for p in r.page_ids], dtype=torch.int32, device=device)
        return cls(ids, lens.to(device, non_blocking=True), lens, indptr.to(device, non_blocking=True), indptr,
                   pages, last.to(device, non_blocking=True), last)

    @property
    def batch_size(self) -> int:
        return self.seq_lens_cpu.shape[0]

    @property
    def max_seq_len(self) -> int:
        return int(self.seq_lens_cpu.max())  # ok: FC101


class TrtllmDecodeBatch(DecodeBatch):
    """A decode batch whose pages live in the HND cache of the trtllm-gen path."""


@dataclasses.dataclass
class PrefillBatch:  # built by the chunked-prefill scheduler: device tensors plus *_cpu mirrors
    input_ids: torch.Tensor
    qo_indptr: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    prefix_lens: torch.Tensor
    prefix_lens_cpu: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return int(self.qo_indptr[-1])  # expect: FC101
