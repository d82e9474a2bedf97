"""A thin wrapper over an ibverbs queue pair; the verbs calls live in a C extension (GPUDirect RDMA)."""
from dataclasses import dataclass
from typing import Dict, List

import torch

import xdc_verbs_ext as _verbs


@dataclass
class Completion:
    wr_id: int
    header: bytes
    nbytes: int


class RdmaEndpoint:
    def __init__(self, nic: str, peer: str):
        self._backend = "ibverbs"
        self.nic = nic
        self.peer = peer
        self._qp = _verbs.create_qp(nic, peer)
        self.regions: Dict[int, int] = {}

    def register(self, t: torch.Tensor) -> int:
        rkey = _verbs.reg_mr(self._qp, t.data_ptr(), t.numel() * t.element_size())
        self.regions[t.data_ptr()] = rkey
        return rkey

    def post_write(self, local: torch.Tensor, remote_addr: int, rkey: int, header: bytes) -> int:
        return _verbs.post_write(self._qp, local.data_ptr(), local.numel() * local.element_size(), remote_addr, rkey, header)

    def poll(self, max_completions: int) -> List[Completion]:
        return [Completion(wr_id, header, nbytes) for wr_id, header, nbytes in _verbs.poll_cq(self._qp, max_completions)]
