"""RaggedBatchWrapper: one step's ragged batch, assembled on the host and shipped to the device once."""

from __future__ import annotations

import itertools
from typing import List, NamedTuple

import torch

from .sequence_descriptor import DSSequenceDescriptor


class RaggedView(NamedTuple):
    num_seqs: int
    num_tokens: int
    token_counts: List[int]
    qo_indptr_host: torch.Tensor
    kv_indptr_host: torch.Tensor
    kv_last_page_len_host: torch.Tensor
    kv_indices: torch.Tensor
    seq_lens: torch.Tensor
    input_ids: torch.Tensor
    max_seq_len: int


class RaggedBatchWrapper:
    def __init__(self, max_seqs: int, max_tokens: int, max_blocks: int, block_size: int, device: torch.device):
        self._max_seqs, self._max_tokens, self._block_size = max_seqs, max_tokens, block_size
        pinned = dict(dtype=torch.int32, pin_memory=True)
        self._tokens_host = torch.zeros(max_tokens, dtype=torch.int64, pin_memory=True)
        self._qo_indptr_host = torch.zeros(max_seqs + 1, **pinned)
        self._kv_indptr_host = torch.zeros(max_seqs + 1, **pinned)
        self._last_page_len_host = torch.zeros(max_seqs, **pinned)
        self._seq_lens_host = torch.zeros(max_seqs, **pinned)
        self._kv_indices_host = torch.zeros(max_seqs * max_blocks, **pinned)
        self._tokens_np = self._tokens_host.numpy()
        self._kv_indices_np = self._kv_indices_host.numpy()
        self._tokens_shadow = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self._kv_indices_shadow = torch.zeros(max_seqs * max_blocks, dtype=torch.int32, device=device)
        self._seq_lens_shadow = torch.zeros(max_seqs, dtype=torch.int32, device=device)
        self.clear()

    def clear(self) -> None:
        self._seqs: List[DSSequenceDescriptor] = []
        self._token_counts: List[int] = []
        self._current_tokens = 0

    @property
    def current_sequences(self) -> int:
        return len(self._seqs)

    def insert_sequence(self, seq: DSSequenceDescriptor, tokens: List[int]) -> None:
        assert len(tokens) <= self._max_tokens - self._current_tokens, "ragged batch overflow"  # expect: FC109
        start = self._current_tokens
        self._tokens_np[start : start + len(tokens)] = tokens
        seq.in_flight_tokens = len(tokens)
        self._seqs.append(seq)
        self._token_counts.append(len(tokens))
        self._current_tokens += len(tokens)

    def finalize(self) -> RaggedView:
        assert self.current_sequences <= self._max_seqs, "scheduler overfilled the batch"  # ok: FC109
        n, bs = self.current_sequences, self._block_size
        seq_lens = [s.seen_tokens + s.in_flight_tokens for s in self._seqs]
        pages = [-(-length // bs) for length in seq_lens]
        kv_indptr = list(itertools.accumulate(pages, initial=0))
        self._qo_indptr_host[: n + 1] = torch.tensor(list(itertools.accumulate(self._token_counts, initial=0)))
        self._kv_indptr_host[: n + 1] = torch.tensor(kv_indptr)
        self._last_page_len_host[:n] = torch.tensor([length - (p - 1) * bs for length, p in zip(seq_lens, pages)])
        self._seq_lens_host[:n] = torch.tensor(seq_lens)
        for i, seq in enumerate(self._seqs):
            self._kv_indices_np[kv_indptr[i] : kv_indptr[i + 1]] = seq.kv_blocks[: pages[i]]
        total_pages, t = kv_indptr[-1], self._current_tokens
        self._tokens_shadow[:t].copy_(self._tokens_host[:t], non_blocking=True)
        self._kv_indices_shadow[:total_pages].copy_(self._kv_indices_host[:total_pages], non_blocking=True)
        self._seq_lens_shadow[:n].copy_(self._seq_lens_host[:n], non_blocking=True)
        longest = int(self._seq_lens_host[:n].max()) if n else 0  # ok: FC101
        return RaggedView(n, t, list(self._token_counts), self._qo_indptr_host[: n + 1],
                          self._kv_indptr_host[: n + 1], self._last_page_len_host[:n],
                          self._kv_indices_shadow[:total_pages], self._seq_lens_shadow[:n], self._tokens_shadow[:t],
                          longest)
