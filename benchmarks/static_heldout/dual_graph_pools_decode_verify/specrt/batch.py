"""Per-step batch records and the contexts each pool hands its model."""

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass
class SpecRequest:
    rid: int
    page_ids: np.ndarray
    seq_len: int
    last_token: int
    emitted: int = 0


@dataclass
class VerifyInputs:
    verify_positions: torch.Tensor
    verify_token_ids: torch.Tensor


@dataclass
class DecodeBatch:
    reqs: list
    seq_lens: torch.Tensor
    seq_lens_np: np.ndarray
    kv_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_cpu: torch.Tensor
    last_tokens: torch.Tensor
    num_pages: int

    @property
    def size(self) -> int:
        return len(self.reqs)

    def verify_inputs(self, draft_ids, n: int) -> VerifyInputs:
        base = self.seq_lens.long().unsqueeze(1)
        positions = (base + torch.arange(n, device=self.seq_lens.device).unsqueeze(0)).reshape(-1)
        tokens = torch.cat([self.last_tokens.unsqueeze(1), draft_ids], dim=1).reshape(-1)
        return VerifyInputs(verify_positions=positions, verify_token_ids=tokens)

    def kv_host(self, extra: int, rows: int, page_size: int):
        """Host indptr / last-page lengths with ``extra`` tokens appended, padded to ``rows`` rows."""
        lens = np.ones(rows, dtype=np.int32)
        lens[: self.size] = self.seq_lens_np + extra
        pages = (lens + page_size - 1) // page_size
        indptr = np.zeros(rows + 1, dtype=np.int32)
        np.cumsum(pages, out=indptr[1:])
        last = (lens - (pages - 1) * page_size).astype(np.int32)
        return torch.from_numpy(indptr), torch.from_numpy(last)


@dataclass
class DraftContext:
    wrapper: Any
    input_ids: torch.Tensor
    hidden: torch.Tensor
    positions: torch.Tensor
    write_pages: torch.Tensor
    write_offsets: torch.Tensor


@dataclass
class VerifyContext:
    wrapper: Any
    token_ids: torch.Tensor
    positions: torch.Tensor
    write_pages: torch.Tensor
    write_offsets: torch.Tensor
    bs: int
