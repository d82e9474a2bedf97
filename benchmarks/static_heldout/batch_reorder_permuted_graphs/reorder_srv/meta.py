from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch


@dataclass
class DecodeMeta:
    bs: int
    bucket: int
    kv_indptr_cpu: torch.Tensor  # natural order
    last_page_cpu: torch.Tensor  # natural order
    kv_indices_np: np.ndarray  # natural order
    sorted_pages_np: np.ndarray
    sorted_indptr_np: np.ndarray
    sorted_last_np: np.ndarray
    n_heavy: int = 0
    long_tail: bool = False
    block_tables: Optional[torch.Tensor] = None
    seq_lens_dev: Optional[torch.Tensor] = None

    @classmethod
    def for_capture(cls, bucket):
        ones = np.ones(bucket, dtype=np.int32)
        indptr = np.arange(bucket + 1, dtype=np.int32)
        return cls(
            bs=bucket,
            bucket=bucket,
            kv_indptr_cpu=torch.from_numpy(indptr),
            last_page_cpu=torch.from_numpy(ones),
            kv_indices_np=np.zeros(bucket, dtype=np.int32),
            sorted_pages_np=ones,
            sorted_indptr_np=indptr,
            sorted_last_np=ones,
        )
