"""Side streams, per-layer events and the remote transfer agent."""
from __future__ import annotations

from typing import Dict, List, Protocol

import torch


class LayerTransferStreams:
    """One stream for remote loads, one for saves, and an event per layer on each."""

    def __init__(self, num_layers: int, device: torch.device):
        self.load_stream = torch.cuda.Stream(device=device)
        self.save_stream = torch.cuda.Stream(device=device)
        self.load_events: List[torch.cuda.Event] = [torch.cuda.Event() for _ in range(num_layers)]
        self.save_events: List[torch.cuda.Event] = [torch.cuda.Event() for _ in range(num_layers)]

    def reset(self) -> None:
        # fresh events so that a layer nobody loads this step is not waited on
        self.load_events = [torch.cuda.Event() for _ in self.load_events]


class PeerHandle(Protocol):
    def read(self, layer: int, remote_ids: List[int], dst: torch.Tensor) -> None: ...

    def read_into(self, layer: int, remote_ids: List[int], kv: torch.Tensor, dst_ids: List[int]) -> None: ...

    def write(self, layer: int, src: torch.Tensor, remote_ids: List[int]) -> None: ...


class RemoteAgent:
    """Stand-in for a NIXL / Mooncake agent: one-sided reads and writes of KV blocks.

    The agent posts its RDMA operations when the current stream reaches them, so the
    buffers it is given must stay untouched until the matching event fires.
    """

    def __init__(self, backend: str, engine_id: str):
        self.backend = backend
        self.engine_id = engine_id
        self._peers: Dict[str, PeerHandle] = {}

    def add_peer(self, engine_id: str, handle: PeerHandle) -> None:
        self._peers[engine_id] = handle

    def _peer(self, engine_id: str) -> PeerHandle:
        peer = self._peers.get(engine_id)
        if peer is None:
            raise KeyError(f"no transfer handle for engine {engine_id!r}; was it registered?")
        return peer

    def read_blocks(self, engine_id: str, layer: int, remote_ids: List[int], dst: torch.Tensor) -> None:
        self._peer(engine_id).read(layer, remote_ids, dst)

    def read_into_blocks(
        self, engine_id: str, layer: int, remote_ids: List[int], kv: torch.Tensor, dst_ids: List[int]
    ) -> None:
        self._peer(engine_id).read_into(layer, remote_ids, kv, dst_ids)

    def write_blocks(self, engine_id: str, layer: int, src: torch.Tensor, remote_ids: List[int]) -> None:
        self._peer(engine_id).write(layer, src, remote_ids)
