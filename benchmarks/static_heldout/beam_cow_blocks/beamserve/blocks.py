"""Copy-on-write block tables for beams.

Beams of one request share their KV blocks by reference count. A fork copies the parent's table and bumps
every count; appending a token to a block that another beam still references first copies the block (the copy
is queued for the device) and swaps the new id into the appending beam's table. The full prompt blocks are
never written again, so the attention backend reads them once per request through a shared-prefix pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np


@dataclass
class BeamLayout:
    beam_ids: List[int]
    num_requests: int
    suffix_indptr_np: np.ndarray
    suffix_indices_np: np.ndarray
    suffix_last_np: np.ndarray
    suffix_counts_np: np.ndarray
    slot_mapping_np: np.ndarray
    prefix_qo_indptr_np: np.ndarray
    prefix_kv_indptr_np: np.ndarray
    prefix_kv_indices_np: np.ndarray
    prefix_last_np: np.ndarray
    changed: bool

    @property
    def num_beams(self) -> int:
        return len(self.beam_ids)


class CoWBlockManager:
    def __init__(self, num_blocks: int, block_size: int, max_blocks_per_beam: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_blocks_per_beam = max_blocks_per_beam
        self.refcount = np.zeros(num_blocks, dtype=np.int32)
        self.free_blocks: List[int] = list(range(num_blocks - 1, -1, -1))
        self.tables: Dict[int, List[int]] = {}
        self.lengths: Dict[int, int] = {}
        self.prompt_blocks: Dict[int, int] = {}
        self.pending_copies: List[Tuple[int, int]] = []
        self._changed = True

    def _alloc(self) -> int:
        if not self.free_blocks:
            raise RuntimeError("KV block pool exhausted")
        blk = self.free_blocks.pop()
        self.refcount[blk] = 1
        return blk

    def _check_free_list(self) -> None:
        assert len(self.free_blocks) == int((self.refcount == 0).sum()), "free list out of sync"  # ok: FC109

    def adopt(self, beam_id: int, blocks: List[int], length: int) -> None:
        """Take over the prompt blocks the prefill worker filled."""
        for blk in blocks:
            self.free_blocks.remove(blk)
        self.refcount[np.asarray(blocks, dtype=np.int64)] = 1
        self.tables[beam_id] = list(blocks)
        self.lengths[beam_id] = length
        self.prompt_blocks[beam_id] = length // self.block_size
        self._changed = True

    def fork(self, parent: int, child: int) -> None:
        assert parent in self.tables, f"unknown beam {parent}"  # expect: FC109
        table = self.tables[parent]
        self.refcount[np.asarray(table, dtype=np.int64)] += 1
        self.tables[child] = list(table)
        self.lengths[child] = self.lengths[parent]
        self.prompt_blocks[child] = self.prompt_blocks[parent]
        self._changed = True

    def free(self, beam_id: int) -> None:
        ids = np.asarray(self.tables.pop(beam_id), dtype=np.int64)
        self.lengths.pop(beam_id)
        self.prompt_blocks.pop(beam_id)
        np.subtract.at(self.refcount, ids, 1)
        released = np.unique(ids[self.refcount[ids] == 0])
        self.free_blocks.extend(released.tolist())
        self._changed = True
        if __debug__:
            self._check_free_list()

    def append_slots(self, beams: List[int]) -> None:
        tails = np.asarray([self.tables[b][-1] for b in beams], dtype=np.int64)
        offsets = np.asarray([self.lengths[b] % self.block_size for b in beams], dtype=np.int64)
        needs_new = offsets == 0
        needs_copy = ~needs_new & (self.refcount[tails] > 1)
        shared_tails = tails[needs_copy]  # ok: FC101
        if len(shared_tails) or needs_new.any():
            self._changed = True
        for i, beam in enumerate(beams):
            if needs_new[i]:
                self.tables[beam].append(self._alloc())
            elif needs_copy[i]:
                fresh = self._alloc()
                self.pending_copies.append((int(tails[i]), fresh))
                self.refcount[tails[i]] -= 1
                self.tables[beam][-1] = fresh
            self.lengths[beam] += 1

    def drain_copies(self) -> List[Tuple[int, int]]:
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def layout(self, beams_by_request: List[List[int]]) -> BeamLayout:
        bs = self.block_size
        beams = [b for ids in beams_by_request for b in ids]
        suffix = [self.tables[b][self.prompt_blocks[b] :] for b in beams]
        longest = max(len(t) for t in suffix)  # ok: FC101
        if longest > self.max_blocks_per_beam:
            raise RuntimeError(f"a beam needs {longest} blocks, limit {self.max_blocks_per_beam}")

        counts = np.fromiter((len(t) for t in suffix), dtype=np.int32, count=len(suffix))
        indptr = np.zeros(len(beams) + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr[1:])
        indices = np.fromiter((blk for t in suffix for blk in t), dtype=np.int32, count=int(indptr[-1]))
        lengths = np.asarray([self.lengths[b] for b in beams], dtype=np.int64)
        prompt_full = np.asarray([self.prompt_blocks[b] for b in beams], dtype=np.int64)
        suffix_tokens = lengths - prompt_full * bs
        last = ((suffix_tokens - 1) % bs + 1).astype(np.int32)
        tails = indices[indptr[1:] - 1].astype(np.int64)
        slots = tails * bs + last - 1

        beams_per_req = np.asarray([len(ids) for ids in beams_by_request], dtype=np.int32)
        qo_indptr = np.zeros(len(beams_by_request) + 1, dtype=np.int32)
        np.cumsum(beams_per_req, out=qo_indptr[1:])
        heads = [ids[0] for ids in beams_by_request]
        pfx = [self.tables[b][: self.prompt_blocks[b]] for b in heads]
        kv_indptr = np.zeros(len(heads) + 1, dtype=np.int32)
        np.cumsum([len(p) for p in pfx], out=kv_indptr[1:])
        changed, self._changed = self._changed, False
        return BeamLayout(
            beam_ids=beams,
            num_requests=len(beams_by_request),
            suffix_indptr_np=indptr,
            suffix_indices_np=indices,
            suffix_last_np=last,
            suffix_counts_np=counts,
            slot_mapping_np=slots,
            prefix_qo_indptr_np=qo_indptr,
            prefix_kv_indptr_np=kv_indptr,
            prefix_kv_indices_np=np.asarray([blk for p in pfx for blk in p], dtype=np.int32),
            prefix_last_np=np.full(len(heads), bs, dtype=np.int32),
            changed=changed,
        )
