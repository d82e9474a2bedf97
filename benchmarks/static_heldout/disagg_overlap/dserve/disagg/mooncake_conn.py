"""Mooncake-style KV transfer: the prefill side pushes KV pages into the decode side's pool."""

from __future__ import annotations

import logging
import threading
from typing import Dict, List, Optional, Tuple

import numpy as np

from dserve.disagg.utils import KVArgs, KVPoll

logger = logging.getLogger(__name__)


class TransferEngine:
    def __init__(self, hostname: str, ib_device: Optional[str]):
        self.hostname = hostname
        self.ib_device = ib_device

    def register(self, ptr: int, length: int) -> None:
        pass

    def transfer_sync(self, session_id: str, src: int, dst: int, length: int) -> int:
        return 0


class MooncakeKVManager:
    def __init__(self, args: KVArgs, disaggregation_mode: str, hostname: str = "127.0.0.1"):
        self.kv_args = args
        self.disaggregation_mode = disaggregation_mode
        self._backend = "mooncake"
        self.engine = TransferEngine(hostname, args.ib_device)
        for ptr, length in zip(args.kv_data_ptrs, args.kv_data_lens):
            self.engine.register(ptr, length)
        self.request_status: Dict[int, KVPoll] = {}
        self.transfer_queue: List[Tuple[int, np.ndarray, slice, bool]] = []
        self.lock = threading.Lock()

    def add_transfer_request(self, bootstrap_room: int, kv_indices: np.ndarray, index_slice: slice, is_last: bool) -> None:
        with self.lock:
            self.transfer_queue.append((bootstrap_room, kv_indices, index_slice, is_last))
            self.request_status[bootstrap_room] = KVPoll.Transferring

    def send_kvcache(self, session_id: str, prefill_kv_indices: np.ndarray, dst_kv_ptrs: List[int], dst_kv_indices: np.ndarray) -> int:
        for src_ptr, dst_ptr, item_len in zip(self.kv_args.kv_data_ptrs, dst_kv_ptrs, self.kv_args.kv_item_lens):
            for s, d in zip(prefill_kv_indices, dst_kv_indices):
                status = self.engine.transfer_sync(session_id, src_ptr + int(s) * item_len, dst_ptr + int(d) * item_len, item_len)
                if status != 0:
                    return status
        return 0


class MooncakeKVSender:
    def __init__(self, mgr: MooncakeKVManager, bootstrap_addr: str, bootstrap_room: int):
        self.kv_mgr = mgr
        self.bootstrap_addr = bootstrap_addr
        self.bootstrap_room = bootstrap_room
        self.num_kv_indices = 0
        self.curr_idx = 0

    def init(self, num_kv_indices: int) -> None:
        self.num_kv_indices = num_kv_indices

    def send(self, kv_indices: np.ndarray) -> None:
        assert kv_indices.ndim == 1 and kv_indices.dtype.kind == "i", "page indices must be a flat integer array"  # expect: FC109
        if self.kv_mgr._backend != "mooncake":  # ok: FC103
            raise NotImplementedError(f"transfer backend {self.kv_mgr._backend}")
        index_slice = slice(self.curr_idx, self.curr_idx + len(kv_indices))
        self.curr_idx += len(kv_indices)
        is_last = self.curr_idx == self.num_kv_indices
        self.kv_mgr.add_transfer_request(self.bootstrap_room, kv_indices, index_slice, is_last)

    def poll(self) -> KVPoll:
        return self.kv_mgr.request_status.get(self.bootstrap_room, KVPoll.Bootstrapping)


class MooncakeKVReceiver:
    def __init__(self, mgr: MooncakeKVManager, bootstrap_addr: str, bootstrap_room: int):
        self.kv_mgr = mgr
        self.bootstrap_room = bootstrap_room

    def poll(self) -> KVPoll:
        return self.kv_mgr.request_status.get(self.bootstrap_room, KVPoll.Bootstrapping)
