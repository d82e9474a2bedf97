from collections import deque
from dataclasses import dataclass, field
from typing import Deque, List, Optional

import numpy as np
import torch


@dataclass
class Request:
    req_id: int
    last_token: int
    seq_len: int
    pages: List[int] = field(default_factory=list)


@dataclass
class MicroBatch:
    mb_id: int
    bucket: Optional[int]
    num_reqs: int
    req_ids: List[int]
    input_ids_cpu: torch.Tensor
    positions_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    page_table_np: np.ndarray


def count_tokens(lens: torch.Tensor) -> int:
    return int(lens.sum())  # expect: FC101


class MicroBatchScheduler:
    """Splits the running set into micro-batches sized to the captured buckets."""

    def __init__(self, buckets, page_size: int, max_pages_per_seq: int):
        self.buckets = sorted(buckets)
        self.page_size = page_size
        self.max_pages_per_seq = max_pages_per_seq
        self.running: Deque[Request] = deque()
        self._next_id = 0

    def _bucket(self, n: int) -> Optional[int]:
        return next((b for b in self.buckets if b >= n), None)

    def next_round(self, num_microbatches: int) -> List[MicroBatch]:
        reqs = list(self.running)
        per = max(1, (len(reqs) + num_microbatches - 1) // num_microbatches)
        out = []
        for i in range(0, len(reqs), per):
            chunk = reqs[i : i + per]
            table = np.zeros((len(chunk), self.max_pages_per_seq), dtype=np.int32)
            for j, r in enumerate(chunk):
                table[j, : len(r.pages)] = r.pages
            out.append(MicroBatch(
                mb_id=self._next_id, bucket=self._bucket(len(chunk)), num_reqs=len(chunk),
                req_ids=[r.req_id for r in chunk],
                input_ids_cpu=torch.tensor([r.last_token for r in chunk], dtype=torch.long),
                positions_cpu=torch.tensor([r.seq_len - 1 for r in chunk], dtype=torch.long),
                seq_lens_cpu=torch.tensor([r.seq_len for r in chunk], dtype=torch.int32),
                page_table_np=table))
            self._next_id += 1
        return out
