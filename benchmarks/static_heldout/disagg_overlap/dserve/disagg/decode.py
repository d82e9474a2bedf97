"""Decode side of disaggregation: requests wait here until their KV pages have arrived."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import List

import numpy as np
import torch

from dserve.attention.decode_backend import DecodeAttnBackend
from dserve.disagg.mooncake_conn import MooncakeKVReceiver
from dserve.disagg.utils import KVPoll, MetadataBuffers
from dserve.managers.schedule_batch import Req

logger = logging.getLogger(__name__)


@dataclass
class DecodeRequest:
    req: Req
    kv_receiver: MooncakeKVReceiver
    metadata_buffer_index: int = -1
    kv_page_indices: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))


class DecodeTransferQueue:
    def __init__(self, metadata_buffers: MetadataBuffers, decode_backend: DecodeAttnBackend):
        self.queue: List[DecodeRequest] = []
        self.metadata_buffers = metadata_buffers
        self.decode_backend = decode_backend

    def add(self, decode_req: DecodeRequest) -> None:
        self.queue.append(decode_req)

    def _warm_single_request_graph(self, d: DecodeRequest) -> None:
        # a lone request will replay the bs=1 graph next step: pre-fill its page table now
        wrapper = self.decode_backend.graph_wrappers.get(1)
        if wrapper is None:
            return
        indices_buf = wrapper._paged_kv_indices_buf  # expect: FC103
        n = len(d.kv_page_indices)
        indices_buf[:n].copy_(torch.from_numpy(d.kv_page_indices), non_blocking=True)  # expect: FC104

    def pop_transferred(self) -> List[Req]:
        transferred: List[Req] = []
        keep: List[DecodeRequest] = []
        for d in self.queue:
            if d.kv_receiver.poll() != KVPoll.Success:
                keep.append(d)
                continue
            first_token = self.metadata_buffers.output_ids[d.metadata_buffer_index][0].item()  # ok: FC101
            d.req.output_ids.append(first_token)
            if len(self.queue) == 1:
                self._warm_single_request_graph(d)
            transferred.append(d.req)
        self.queue = keep
        return transferred
