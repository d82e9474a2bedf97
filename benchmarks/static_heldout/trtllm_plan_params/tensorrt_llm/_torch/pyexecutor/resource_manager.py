"""Paged KV cache manager: block tables on the host, a device copy for the kernels, defragmentation."""

from __future__ import annotations

import weakref
from collections import defaultdict
from typing import Callable, Optional

import numpy as np
import torch

from tensorrt_llm._torch.attention_backend import FlashInferAttentionMetadata


class KVCacheManager:
    def __init__(self, num_blocks: int, tokens_per_block: int, max_num_requests: int, max_blocks_per_seq: int):
        assert tokens_per_block & (tokens_per_block - 1) == 0, "tokens_per_block must be a power of two"  # expect: FC109
        self.num_blocks = num_blocks
        self.tokens_per_block = tokens_per_block
        self.max_num_requests = max_num_requests
        self.host_block_table = np.full((max_num_requests, max_blocks_per_seq), -1, dtype=np.int32)
        self.num_blocks_host = np.zeros(max_num_requests, dtype=np.int32)
        # device twins read by the trtllm-gen kernels of the attention op
        self.block_table_cuda = torch.full((max_num_requests, max_blocks_per_seq), -1, dtype=torch.int32, device="cuda")
        self.num_blocks_cuda = torch.zeros(max_num_requests, dtype=torch.int32, device="cuda")
        self._slots: dict[int, int] = {}
        self._free_slots = list(range(max_num_requests))
        self._free_blocks = list(range(num_blocks))
        self._listeners: dict[str, list[Callable]] = defaultdict(list)
        self._meta_ref: Optional[weakref.ref] = None

    def attach_metadata(self, metadata: FlashInferAttentionMetadata) -> None:
        """Metadata whose page indices follow block moves (the graph metadata; it outlives no step)."""
        self._meta_ref = weakref.ref(metadata)

    def register_listener(self, event: str, fn: Callable) -> None:
        self._listeners[event].append(fn)

    def _take_block(self) -> int:
        assert self._free_blocks, "out of KV blocks; the scheduler admitted too much"  # ok: FC109
        return self._free_blocks.pop()

    def add_sequence(self, request_id: int, num_tokens: int) -> None:
        slot = self._free_slots.pop()
        self._slots[request_id] = slot
        self.extend_sequence(request_id, num_tokens)

    def add_dummy_requests(self, request_ids: list[int]) -> None:
        for rid in request_ids:
            if rid not in self._slots:
                self.add_sequence(rid, self.tokens_per_block)

    def extend_sequence(self, request_id: int, num_new_tokens: int) -> None:
        slot = self._slots[request_id]
        have = int(self.num_blocks_host[slot])
        need = -(-num_new_tokens // self.tokens_per_block)
        for i in range(have, have + need):
            self.host_block_table[slot, i] = self._take_block()
        self.num_blocks_host[slot] = have + need
        row = torch.from_numpy(self.host_block_table[slot]).pin_memory()
        self.block_table_cuda[slot].copy_(row, non_blocking=True)
        self.num_blocks_cuda[slot].fill_(have + need)

    def get_batch_cache_indices(self, request_ids: list[int]) -> list[list[int]]:
        out = []
        for rid in request_ids:
            slot = self._slots[rid]
            n = int(self.num_blocks_cuda[slot])  # expect: FC101
            out.append(self.host_block_table[slot, :n].tolist())  # ok: FC101
        return out

    def free_sequence(self, request_id: int) -> None:
        slot = self._slots.pop(request_id)
        n = int(self.num_blocks_host[slot])
        self._free_blocks.extend(self.host_block_table[slot, :n].tolist())
        self.host_block_table[slot, :] = -1
        self.num_blocks_host[slot] = 0
        self._free_slots.append(slot)
        for fn in self._listeners["free"]:
            fn(request_id)
        assert len(self._free_slots) <= self.max_num_requests  # ok: FC109

    def _compute_moves(self) -> dict[int, int]:
        used = sorted(int(b) for b in self.host_block_table[self.host_block_table >= 0])
        return {src: dst for dst, src in enumerate(used) if src != dst}

    def defragment(self) -> None:
        """Compact used blocks to the front of the pool between steps."""
        moves = self._compute_moves()
        if not moves:
            return
        remap_host = np.arange(self.num_blocks, dtype=np.int32)
        for src, dst in moves.items():
            remap_host[src] = dst
        self.host_block_table[:] = np.where(self.host_block_table >= 0, remap_host[self.host_block_table], -1)
        remap = torch.from_numpy(remap_host).to("cuda", non_blocking=True)
        self.block_table_cuda.copy_(torch.from_numpy(self.host_block_table).to("cuda", non_blocking=True))
        for fn in self._listeners["defrag"]:
            fn(moves)
        meta: Optional[FlashInferAttentionMetadata] = self._meta_ref() if self._meta_ref is not None else None
        if meta is not None:
            # the graph metadata's indices still name the old blocks; remap them in place
            meta._paged_kv_indices.copy_(remap[meta._paged_kv_indices.long()])  # expect: FC104

    def get_workspace_bytes(self, metadata: FlashInferAttentionMetadata) -> int:
        """Bytes of FlashInfer scratch held by one metadata object's wrappers (memory accounting)."""
        total = metadata.workspace_buffer.numel()
        for wrappers in metadata._wrappers.values():
            total += wrappers.decode._int_workspace_buffer.numel()  # expect: FC103
        return total
