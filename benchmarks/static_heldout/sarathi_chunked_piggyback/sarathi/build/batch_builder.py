"""Builds the hybrid (decode + piggybacked prefill chunks) batch of one step.

Lives in ``sarathi/build/`` next to the other step builders; the folder has no
``__init__.py`` and is imported as a namespace package.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch

from sarathi.config import SchedulerConfig
from sarathi.sequence import ChunkSlice, Sequence, SeqStatus


@dataclass
class HybridBatch:
    num_decodes: int
    num_prefill_tokens: int
    seq_ids: List[int]
    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    sample_rows: torch.Tensor
    sample_mask_gpu: torch.Tensor
    # decode rows (first ``num_decodes`` requests)
    decode_kv_indptr_cpu: torch.Tensor
    decode_kv_indices_gpu: torch.Tensor
    decode_last_page_len_cpu: torch.Tensor
    decode_last_page_len_gpu: torch.Tensor
    decode_block_tables_gpu: torch.Tensor
    decode_seq_lens_gpu: torch.Tensor
    max_decode_len: int
    # prefill chunks piggybacked on the decodes
    chunk_qo_indptr_cpu: torch.Tensor
    chunk_qo_indptr_gpu: torch.Tensor
    chunk_kv_indptr_cpu: torch.Tensor
    chunk_kv_indices_gpu: torch.Tensor
    chunk_last_page_len_cpu: torch.Tensor

    @property
    def num_seqs(self) -> int:
        return len(self.seq_ids)

    @property
    def num_chunks(self) -> int:
        return self.num_seqs - self.num_decodes

    @property
    def num_sampled_rows(self) -> int:
        # decodes always sample; a chunk samples only when it finishes its prompt
        return int(self.sample_mask_gpu.sum())  # expect: FC101


class HybridBatchBuilder:
    """Host numpy bookkeeping, one pinned staging area, one device copy per step."""

    def __init__(self, cfg: SchedulerConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.max_num_seqs = cfg.max_num_seqs
        max_pages = cfg.max_num_seqs * cfg.max_pages_per_seq
        n = cfg.max_num_seqs
        self.qo_indptr_cpu = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_cpu = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices_cpu = torch.zeros(max_pages, dtype=torch.int32, pin_memory=True)
        self.last_page_len_cpu = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        self.tokens_cpu = torch.zeros(cfg.token_budget, dtype=torch.int64, pin_memory=True)
        self.positions_cpu = torch.zeros(cfg.token_budget, dtype=torch.int64, pin_memory=True)
        self.slots_cpu = torch.zeros(cfg.token_budget, dtype=torch.int64, pin_memory=True)
        self.sample_rows_cpu = torch.zeros(n, dtype=torch.int64, pin_memory=True)
        self.sample_mask_cpu = torch.zeros(n, dtype=torch.bool, pin_memory=True)
        self.seq_lens_cpu = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        (self.qo_indptr_np, self.kv_indptr_np, self.kv_indices_np, self.last_page_len_np) = (
            t.numpy() for t in (self.qo_indptr_cpu, self.kv_indptr_cpu, self.kv_indices_cpu, self.last_page_len_cpu))
        (self.tokens_np, self.positions_np, self.slots_np, self.seq_lens_np) = (
            t.numpy() for t in (self.tokens_cpu, self.positions_cpu, self.slots_cpu, self.seq_lens_cpu))

        self.qo_indptr_dev = torch.zeros(n + 1, dtype=torch.int32, device=device)
        self.kv_indices_dev = torch.zeros(max_pages, dtype=torch.int32, device=device)
        self.last_page_len_dev = torch.zeros(n, dtype=torch.int32, device=device)
        self.tokens_dev = torch.zeros(cfg.token_budget, dtype=torch.int64, device=device)
        self.positions_dev = torch.zeros(cfg.token_budget, dtype=torch.int64, device=device)
        self.slots_dev = torch.zeros(cfg.token_budget, dtype=torch.int64, device=device)
        self.sample_rows_dev = torch.zeros(n, dtype=torch.int64, device=device)
        self.sample_mask_dev = torch.zeros(n, dtype=torch.bool, device=device)
        self.seq_lens_dev = torch.zeros(n, dtype=torch.int32, device=device)
        self.block_tables_dev = torch.zeros(n, cfg.max_pages_per_seq, dtype=torch.int32, device=device)

    def _fill_pages(self, row: int, seq: Sequence, kv_len: int, page_off: int) -> int:
        ps = self.cfg.page_size
        num_pages = (kv_len + ps - 1) // ps
        self.kv_indices_np[page_off : page_off + num_pages] = seq.page_ids[:num_pages]
        self.kv_indptr_np[row + 1] = page_off + num_pages
        self.last_page_len_np[row] = kv_len - (num_pages - 1) * ps
        return page_off + num_pages

    def build(self, decode_seqs: List[Sequence], chunks: List[ChunkSlice]) -> HybridBatch:
        assert len(decode_seqs) + len(chunks) <= self.max_num_seqs, "batch exceeds max_num_seqs"  # expect: FC109
        nd, nc = len(decode_seqs), len(chunks)
        ps = self.cfg.page_size
        tok = 0
        page_off = 0
        self.qo_indptr_np[0] = 0
        self.kv_indptr_np[0] = 0
        self.sample_mask_cpu[: nd + nc].zero_()
        for row, seq in enumerate(decode_seqs):
            pos = seq.total_len - 1
            self.tokens_np[tok] = seq.token_at(pos)
            self.positions_np[tok] = pos
            self.slots_np[tok] = seq.page_ids[pos // ps] * ps + pos % ps
            self.seq_lens_np[row] = seq.total_len
            self.sample_rows_cpu[row] = tok
            self.sample_mask_cpu[row] = True
            page_off = self._fill_pages(row, seq, seq.total_len, page_off)
            tok += 1
        decode_pages = page_off
        max_decode_len = int(self.seq_lens_np[:nd].max()) if nd else 0  # ok: FC101
        # the chunks get their own qo/kv indptr, rebased at zero
        self.kv_indptr_np[nd] = 0
        chunk_page_base = page_off
        for i, chunk in enumerate(chunks):
            row = nd + i
            for j in range(chunk.length):
                pos = chunk.start + j
                self.tokens_np[tok + j] = chunk.seq.token_at(pos)
                self.positions_np[tok + j] = pos
                self.slots_np[tok + j] = chunk.seq.page_ids[pos // ps] * ps + pos % ps
            self.qo_indptr_np[i + 1] = self.qo_indptr_np[i] + chunk.length
            page_off = self._fill_pages(row, chunk.seq, chunk.start + chunk.length, page_off)
            self.kv_indptr_np[row + 1] -= chunk_page_base
            tok += chunk.length
            if chunk.completes_prompt:
                self.sample_rows_cpu[row] = tok - 1
                self.sample_mask_cpu[row] = True
        total_tokens = tok
        if self.positions_dev.numel() < total_tokens:
            self.positions_dev = torch.empty(2 * total_tokens, dtype=torch.int64, device=self.device)  # expect: FC107

        self.tokens_dev[:tok].copy_(self.tokens_cpu[:tok], non_blocking=True)
        self.positions_dev[:tok].copy_(self.positions_cpu[:tok], non_blocking=True)
        self.slots_dev[:tok].copy_(self.slots_cpu[:tok], non_blocking=True)
        self.kv_indices_dev[:page_off].copy_(self.kv_indices_cpu[:page_off], non_blocking=True)
        self.last_page_len_dev[: nd + nc].copy_(self.last_page_len_cpu[: nd + nc], non_blocking=True)
        self.qo_indptr_dev[: nc + 1].copy_(self.qo_indptr_cpu[: nc + 1], non_blocking=True)
        self.sample_rows_dev[: nd + nc].copy_(self.sample_rows_cpu[: nd + nc], non_blocking=True)
        self.sample_mask_dev[: nd + nc].copy_(self.sample_mask_cpu[: nd + nc], non_blocking=True)
        self.seq_lens_dev[:nd].copy_(self.seq_lens_cpu[:nd], non_blocking=True)
        for row, seq in enumerate(decode_seqs):
            pages = torch.as_tensor(seq.page_ids, dtype=torch.int32)
            self.block_tables_dev[row, : pages.numel()].copy_(pages, non_blocking=True)

        return HybridBatch(
            num_decodes=nd,
            num_prefill_tokens=tok - nd,
            seq_ids=[s.seq_id for s in decode_seqs] + [c.seq.seq_id for c in chunks],
            input_ids=self.tokens_dev[:tok],
            positions=self.positions_dev[:tok],
            slot_mapping=self.slots_dev[:tok],
            sample_rows=self.sample_rows_dev[: nd + nc],
            sample_mask_gpu=self.sample_mask_dev[: nd + nc],
            decode_kv_indptr_cpu=self.kv_indptr_cpu[: nd + 1],
            decode_kv_indices_gpu=self.kv_indices_dev[:decode_pages],
            decode_last_page_len_cpu=self.last_page_len_cpu[:nd],
            decode_last_page_len_gpu=self.last_page_len_dev[:nd],
            decode_block_tables_gpu=self.block_tables_dev[:nd],
            decode_seq_lens_gpu=self.seq_lens_dev[:nd],
            max_decode_len=max_decode_len,
            chunk_qo_indptr_cpu=self.qo_indptr_cpu[: nc + 1],
            chunk_qo_indptr_gpu=self.qo_indptr_dev[: nc + 1],
            chunk_kv_indptr_cpu=self.kv_indptr_cpu[nd : nd + nc + 1],
            chunk_kv_indices_gpu=self.kv_indices_dev[chunk_page_base:page_off],
            chunk_last_page_len_cpu=self.last_page_len_cpu[nd : nd + nc],
        )

    def dummy_batch(self, num_decodes: int, chunk_tokens: int = 0) -> HybridBatch:
        """One-token decodes on page 0 (plus one prompt chunk) for graph capture."""
        ps = self.cfg.page_size
        decodes = [
            Sequence(-1 - i, [0], page_ids=[0], status=SeqStatus.DECODING) for i in range(num_decodes)
        ]
        chunks: List[ChunkSlice] = []
        if chunk_tokens:
            pages = list(range(1, 1 + (chunk_tokens + ps - 1) // ps))
            chunks.append(ChunkSlice(Sequence(-1 - num_decodes, [0] * chunk_tokens, page_ids=pages), 0, chunk_tokens))
        return self.build(decodes, chunks)
