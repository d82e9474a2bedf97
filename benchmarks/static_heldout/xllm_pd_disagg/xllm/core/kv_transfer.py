"""KV block transfer between instances over a transfer engine (RDMA / NVLink), completion tracked
with CUDA events recorded on the transfer stream."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Deque, FrozenSet, List, Optional, Protocol

import numpy as np
import torch

if TYPE_CHECKING:
    from xllm.core.decode_instance import DecodeInstance


class TransferBackend(Protocol):
    def write_blocks(self, src_block_ids: torch.Tensor, dst_instance: str, dst_block_ids: torch.Tensor, stream: torch.cuda.Stream) -> None: ...


@dataclass
class TransferHandle:
    request_ids: FrozenSet[str]
    dst_blocks: torch.Tensor
    dst_slot: int
    event: torch.cuda.Event


class KVTransferEngine:
    def __init__(self, backend: TransferBackend, device: torch.device, staging_blocks: int):
        self.backend = backend
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.pending: Deque[TransferHandle] = deque()
        self.staging_host = torch.empty(staging_blocks, dtype=torch.int32, pin_memory=True)
        self.decode: Optional["DecodeInstance"] = None

    def attach_decode(self, decode: "DecodeInstance") -> None:
        """Co-located decode instance: landed block ids go straight into its page table."""
        self.decode = decode
        self.decode_kv_indices = decode.kv_indices_dev

    def stage_block_ids(self, block_ids: np.ndarray) -> torch.Tensor:
        if block_ids.size > self.staging_host.numel():
            self.staging_host = torch.empty(block_ids.size * 2, dtype=torch.int32, pin_memory=True)  # ok: FC107
        self.staging_host[: block_ids.size] = torch.from_numpy(block_ids)
        return self.staging_host[: block_ids.size]

    def send(self, request_ids: List[str], src_blocks: torch.Tensor, dst_instance: str, dst_block_ids: np.ndarray, dst_slot: int) -> TransferHandle:
        dst = self.stage_block_ids(dst_block_ids).to(self.device, non_blocking=True)
        with torch.cuda.stream(self.stream):
            self.stream.wait_stream(torch.cuda.current_stream())
            self.backend.write_blocks(src_blocks, dst_instance, dst, self.stream)
            event = torch.cuda.Event()
            event.record(self.stream)
        handle = TransferHandle(frozenset(request_ids), dst, dst_slot, event)
        self.pending.append(handle)
        return handle

    def land(self, handle: TransferHandle) -> None:
        """Landed blocks become the requests' pages in the co-located decode instance."""
        n = handle.dst_blocks.numel()
        self.decode_kv_indices[handle.dst_slot : handle.dst_slot + n].copy_(handle.dst_blocks, non_blocking=True)  # expect: FC104

    def poll(self) -> List[TransferHandle]:
        landed = []
        while self.pending:
            handle = self.pending[0]
            if not handle.event.query():  # ok: FC101
                break
            self.land(self.pending.popleft())
            landed.append(handle)
        return landed

    def fence(self, request_ids: FrozenSet[str]) -> None:
        """Order the current stream after these requests' transfers, on the GPU only."""
        stream = torch.cuda.current_stream()
        for handle in self.pending:
            if handle.request_ids & request_ids:
                stream.wait_event(handle.event)  # ok: FC101

    def drain(self) -> None:
        """Every in-flight block must have landed, e.g. before the decode batch moves to a larger bucket."""
        while self.pending:
            handle = self.pending.popleft()
            handle.event.synchronize()  # expect: FC101
            self.land(handle)
