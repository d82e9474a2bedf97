"""Per-step batch: device tensors for the kernels, pinned host mirrors for plan()."""
import enum
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch


class ForwardMode(enum.Enum):
    DECODE = "decode"
    EXTEND = "extend"


@dataclass
class ForwardBatch:
    mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    req_pool_indices: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    qo_indptr: Optional[torch.Tensor] = None
    qo_indptr_cpu: Optional[torch.Tensor] = None
    extend_lens: Optional[torch.Tensor] = None
    extend_prefix_lens: Optional[torch.Tensor] = None
    extend_start_loc: Optional[torch.Tensor] = None
    @classmethod
    def from_host(cls, mode: ForwardMode, input_ids, seq_lens, prefix_lens, pages, slots, page_size: int, device):
        """Built by the scheduler from host lists; each device field is one pinned non_blocking upload."""
        lens, prefix = np.asarray(seq_lens, dtype=np.int32), np.asarray(prefix_lens, dtype=np.int32)
        npages = (lens + page_size - 1) // page_size
        indptr, qo = (np.concatenate([[0], np.cumsum(n)]).astype(np.int32) for n in (npages, lens - prefix))
        last = (lens - (npages - 1) * page_size).astype(np.int32)
        pos = lens - 1 if mode is ForwardMode.DECODE else np.concatenate([np.arange(p, n) for p, n in zip(prefix, lens)])
        host = lambda a: torch.from_numpy(np.ascontiguousarray(a)).pin_memory()  # noqa: E731
        dev = lambda a: host(a).to(device, non_blocking=True)  # noqa: E731
        table = np.concatenate([np.asarray(r[:n], dtype=np.int32) for r, n in zip(pages, npages)])
        return cls(mode, len(lens), dev(np.asarray(input_ids, dtype=np.int64)), dev(pos.astype(np.int64)), dev(lens),
                   host(lens), dev(np.asarray(slots, dtype=np.int64)), dev(indptr), host(indptr), dev(table),
                   dev(last), host(last), dev(qo), host(qo), dev(lens - prefix), dev(prefix))
