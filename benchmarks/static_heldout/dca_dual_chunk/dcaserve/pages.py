"""Page lists per request, split into the three DCA key streams on the host."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence

import numpy as np
import torch

STREAM_NAMES = ("intra", "succ", "inter")


@dataclass
class StreamPages:
    """CSR page layout of one key stream for a batch (host arrays, int32)."""

    indptr: np.ndarray
    indices: np.ndarray
    last_page_len: np.ndarray

    @property
    def nnz(self) -> int:
        return int(self.indptr[-1])  # ok: FC101

    @classmethod
    def empty(cls, bs: int) -> "StreamPages":
        return cls(
            indptr=np.zeros(bs + 1, dtype=np.int32),
            indices=np.zeros(0, dtype=np.int32),
            last_page_len=np.zeros(bs, dtype=np.int32),
        )


def _csr(rows: List[np.ndarray], last: List[int]) -> StreamPages:
    counts = np.fromiter((len(r) for r in rows), dtype=np.int32, count=len(rows))
    indptr = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum(counts, out=indptr[1:])
    indices = np.concatenate(rows).astype(np.int32) if rows else np.zeros(0, dtype=np.int32)
    return StreamPages(indptr=indptr, indices=indices, last_page_len=np.asarray(last, dtype=np.int32))


class DCAPageTable:
    """Host page lists of every live request, with a device copy for the prefill kernels.

    Page 0 is never handed out: padded graph rows point at it.
    """

    def __init__(self, num_pages: int, max_reqs: int, page_size: int, chunk_size: int, device: torch.device):
        assert page_size in (16, 32, 64) and chunk_size % page_size == 0  # expect: FC109
        self.page_size = page_size
        self.chunk_pages = chunk_size // page_size
        self.num_pages = num_pages
        self.free: List[int] = list(range(num_pages - 1, 0, -1))
        self.free_pages = num_pages - 1
        self.req_pages: Dict[int, List[int]] = {}
        self.req_slot: Dict[int, int] = {}
        self.free_slots = list(range(max_reqs - 1, -1, -1))
        max_pages = -(-1_048_576 // page_size)
        # block table for trtllm-gen's context kernel, one row per request slot
        self.block_table = torch.zeros((max_reqs, max_pages), dtype=torch.int32, device=device)

    # ------------------------------------------------------------------ allocation
    def admit(self, rid: int) -> int:
        if not self.free_slots:
            raise RuntimeError("no free request slot")
        slot = self.free_slots.pop()
        self.req_slot[rid] = slot
        self.req_pages[rid] = []
        return slot

    def grow(self, rid: int, new_len: int) -> List[int]:
        pages = self.req_pages[rid]
        need = -(-new_len // self.page_size) - len(pages)
        if need > self.free_pages:
            raise MemoryError(f"request {rid} needs {need} pages, {self.free_pages} free")
        fresh = [self.free.pop() for _ in range(need)]
        if fresh:
            start = len(pages)
            pages.extend(fresh)
            self.free_pages -= len(fresh)
            row = torch.tensor(fresh, dtype=torch.int32)
            self.block_table[self.req_slot[rid], start : start + len(fresh)].copy_(row, non_blocking=True)
        return fresh

    def release(self, rid: int) -> None:
        pages = self.req_pages.pop(rid)
        self.free.extend(reversed(pages))
        self.free_pages += len(pages)
        self.free_slots.append(self.req_slot.pop(rid))

    def audit(self) -> None:
        """Cheap consistency check the scheduler runs every few hundred steps."""
        assert self.free_pages == len(self.free)  # ok: FC109

    # ------------------------------------------------------------------ stream split
    def split_for_decode(self, rids: Sequence[int], seq_lens_np: np.ndarray) -> Dict[str, StreamPages]:
        """Split each row's pages for a decode query at position ``seq_len - 1``.

        Padded rows (rid < 0) get one page (page 0) in the intra stream and nothing elsewhere.
        """
        cp, ps = self.chunk_pages, self.page_size
        intra_rows, succ_rows, inter_rows = [], [], []
        intra_last, succ_last, inter_last = [], [], []
        for rid, seq_len in zip(rids, seq_lens_np.tolist()):
            if rid < 0:
                intra_rows.append(np.zeros(1, dtype=np.int32))
                intra_last.append(1)
                succ_rows.append(np.zeros(0, dtype=np.int32))
                succ_last.append(0)
                inter_rows.append(np.zeros(0, dtype=np.int32))
                inter_last.append(0)
                continue
            pages = np.asarray(self.req_pages[rid], dtype=np.int32)
            pos = seq_len - 1
            chunk = pos // (cp * ps)
            first = chunk * cp
            intra_rows.append(pages[first : pos // ps + 1])
            intra_last.append(pos % ps + 1)
            succ_rows.append(pages[max(first - cp, 0) : first])
            succ_last.append(ps if chunk >= 1 else 0)
            inter_rows.append(pages[: max(first - cp, 0)])
            inter_last.append(ps if chunk >= 2 else 0)
        return {
            "intra": _csr(intra_rows, intra_last),
            "succ": _csr(succ_rows, succ_last),
            "inter": _csr(inter_rows, inter_last),
        }

    def split_for_prefill(
        self, rids: Sequence[int], prefix_lens_np: np.ndarray
    ) -> Dict[str, StreamPages]:
        """Cached pages a prefill chunk attends to: the previous chunk (succ) and older chunks (inter).

        The chunk's own tokens go through the ragged intra-chunk kernel.
        """
        cp = self.chunk_pages
        succ_rows, inter_rows, succ_last, inter_last = [], [], [], []
        for rid, prefix in zip(rids, prefix_lens_np.tolist()):
            pages = np.asarray(self.req_pages[rid], dtype=np.int32)
            done_chunks = prefix // (cp * self.page_size)
            first = done_chunks * cp
            succ_rows.append(pages[max(first - cp, 0) : first])
            inter_rows.append(pages[: max(first - cp, 0)])
            succ_last.append(self.page_size if done_chunks >= 1 else 0)
            inter_last.append(self.page_size if done_chunks >= 2 else 0)
        return {"succ": _csr(succ_rows, succ_last), "inter": _csr(inter_rows, inter_last)}
