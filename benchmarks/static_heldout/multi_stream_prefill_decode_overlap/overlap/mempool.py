"""A stream-aware block pool over one device arena. A block freed on one stream is handed to
another stream only once the freeing stream's event has completed."""

from typing import Dict, List, Tuple

import torch


class StreamAwarePool:
    def __init__(self, block_bytes: int, num_blocks: int, device: torch.device, grow_blocks: int):
        self.block_bytes = block_bytes
        self.device = device
        self.grow_blocks = grow_blocks
        self.num_blocks = num_blocks
        self.arena = torch.empty(num_blocks * block_bytes, dtype=torch.uint8, device=device)
        self.free_host: List[int] = list(range(num_blocks))
        self.deferred: Dict[str, List[Tuple[torch.cuda.Event, List[int]]]] = {}
        # size classes: metadata blocks and activation blocks
        self._num_levels = 2

    def alloc(self, nbytes: int, stream_name: str) -> List[int]:
        assert nbytes > 0, "zero-byte block request"  # expect: FC109
        self._reclaim(stream_name)
        need = -(-nbytes // self.block_bytes)
        if len(self.free_host) < need:
            self._grow(max(need, self.grow_blocks))
        blocks, self.free_host = self.free_host[:need], self.free_host[need:]
        self._check_free_list()
        return blocks

    def view(self, blocks: List[int], rows: int, cols: int, dtype=torch.bfloat16) -> torch.Tensor:
        start = blocks[0] * self.block_bytes
        nbytes = rows * cols * torch.finfo(dtype).bits // 8
        return self.arena[start : start + nbytes].view(dtype).view(rows, cols)

    def release(self, blocks: List[int], stream: torch.cuda.Stream, stream_name: str) -> None:
        evt = torch.cuda.Event()
        evt.record(stream)
        self.deferred.setdefault(stream_name, []).append((evt, blocks))

    def _reclaim(self, stream_name: str) -> None:
        for name, entries in self.deferred.items():
            keep = []
            for evt, blocks in entries:
                if name == stream_name or evt.query():
                    self.free_host.extend(blocks)
                else:
                    keep.append((evt, blocks))
            self.deferred[name] = keep

    def _grow(self, extra: int) -> None:
        old = self.num_blocks
        fresh = torch.empty(extra * self.block_bytes, dtype=torch.uint8, device=self.device)
        self.arena = torch.cat([self.arena, fresh])  # expect: FC107
        self.free_host.extend(range(old, old + extra))
        self.num_blocks = old + extra

    def _check_free_list(self) -> None:
        assert len(self.free_host) <= self.num_blocks  # ok: FC109
