"""The per-step batch: questions (prefill) or answers (decode), grouped by document."""

from typing import List, Optional

import numpy as np
import torch


class ForwardBatch:
    def __init__(
        self,
        req_ids: List[int],
        doc_ids_np: np.ndarray,
        question_lens_np: np.ndarray,
        unique_lens_np: np.ndarray,
        unique_pages: List[np.ndarray],
        input_ids: torch.Tensor,
        page_size: int,
        device,
        is_decode: bool,
    ):
        self.req_ids = req_ids
        self.batch_size = len(req_ids)
        self.is_decode = is_decode
        self.doc_ids_np = doc_ids_np
        self.question_lens_cpu = torch.from_numpy(question_lens_np.astype(np.int32))
        self.question_lens = self.question_lens_cpu.to(device, non_blocking=True)
        self.unique_lens_np = unique_lens_np
        counts = np.array([len(p) for p in unique_pages], dtype=np.int32)
        self.unique_indptr_np = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        self.unique_pages_np = np.concatenate(unique_pages) if unique_pages else np.zeros(0, np.int32)
        self.unique_kv_indices = torch.from_numpy(self.unique_pages_np).to(device, non_blocking=True)
        last_np = ((unique_lens_np - 1) % page_size + 1).astype(np.int32)
        self.question_last_page_len_np = last_np
        self.question_last_page_len = torch.from_numpy(last_np).to(device, non_blocking=True)
        self.input_ids = input_ids

    @property
    def total_question_tokens(self) -> int:
        return int(self.question_lens_cpu.sum())  # ok: FC101

    @property
    def num_docs(self) -> int:
        return len(np.unique(self.doc_ids_np))  # ok: FC101


class CascadeLevels:
    """Host and device views of both cascade levels for one step."""

    def __init__(self, bs: int, num_docs: int, device):
        self.doc_qo_indptr_host = torch.zeros(num_docs + 1, dtype=torch.int32, pin_memory=True)
        self.doc_kv_indptr_host = torch.zeros(num_docs + 1, dtype=torch.int32, pin_memory=True)
        self.doc_last_host = torch.ones(num_docs, dtype=torch.int32, pin_memory=True)
        self.doc_kv_indices = torch.zeros(0, dtype=torch.int32, device=device)
        self.unique_qo_indptr_host = torch.zeros(bs + 1, dtype=torch.int32, pin_memory=True)
        self.unique_kv_indptr_host = torch.zeros(bs + 1, dtype=torch.int32, pin_memory=True)
        self.positions = torch.zeros(bs, dtype=torch.int64, device=device)  # ok: FC107


def group_by_document(doc_ids_np: np.ndarray, doc_pages: List[np.ndarray], doc_last: np.ndarray,
                      page_size: int) -> Optional[tuple]:
    """Level-0 arrays: queries of one document are contiguous in the batch."""
    if doc_ids_np.size == 0:
        return None
    change = np.flatnonzero(np.diff(doc_ids_np)) + 1
    starts = np.concatenate([[0], change, [doc_ids_np.size]]).astype(np.int32)
    groups = doc_ids_np[starts[:-1]]
    kv_counts = np.array([len(doc_pages[g]) for g in groups], dtype=np.int32)
    kv_indptr = np.concatenate([[0], np.cumsum(kv_counts)]).astype(np.int32)
    indices = np.concatenate([doc_pages[g] for g in groups]).astype(np.int32)
    return starts, kv_indptr, indices, doc_last[groups].astype(np.int32)
