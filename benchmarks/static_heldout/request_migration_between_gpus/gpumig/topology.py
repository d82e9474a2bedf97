"""The node: its GPUs and one copy link per direction."""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import torch


class PeerLink:
    """Direction ``src -> dst``: a gather stream on the source, a copy stream on the destination."""

    def __init__(self, src: torch.device, dst: torch.device) -> None:
        self.src = src
        self.dst = dst
        self.peer_ok = torch.cuda.can_device_access_peer(dst.index, src.index)
        self.src_stream = torch.cuda.Stream(device=src)
        self.stream = torch.cuda.Stream(device=dst)


class NodeTopology:
    def __init__(self, devices: Sequence[str] = ("cuda:0", "cuda:1")) -> None:
        self.devices: List[torch.device] = [torch.device(d) for d in devices]
        self.links: Dict[Tuple[int, int], PeerLink] = {
            (i, j): PeerLink(self.devices[i], self.devices[j])
            for i in range(len(self.devices))
            for j in range(len(self.devices))
            if i != j
        }

    def link(self, src: int, dst: int) -> PeerLink:
        return self.links[(src, dst)]
