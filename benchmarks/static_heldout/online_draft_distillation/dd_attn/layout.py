"""The batch both models see, and index helpers."""
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class SpecBatch:
    num_rows: int
    num_pages: int
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    seq_lens_np: np.ndarray
    last_tokens: torch.Tensor

    @classmethod
    def dummy(cls, bs: int, device: torch.device) -> "SpecBatch":
        return cls(
            num_rows=bs, num_pages=bs, kv_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32),
            kv_indices=torch.arange(bs, dtype=torch.int32, device=device), seq_lens_np=np.ones(bs, dtype=np.int64),
            last_tokens=torch.zeros(bs, dtype=torch.int64, device=device),
        )


def spec_qo_indptr(bs: int, k: int, device: torch.device) -> torch.Tensor:
    """Each row verifies its last token and ``k`` draft tokens."""
    return torch.arange(0, (bs + 1) * (k + 1), k + 1, dtype=torch.int32, device=device)


def _pad_rows(last_page_len: torch.Tensor, n: int, bs: int) -> None:
    last_page_len[n:bs].fill_(1)
