"""Receives KV pages from the prefill stage and stages their page ids."""

from typing import Dict

import torch

from epd.protocol import KVPageHandle
from epd.transfer import TransferEngine
from epd_decode.decode_attn import DecodeAttnBackend


def _scatter_page_ids(dst: torch.Tensor, page_ids: torch.Tensor, offset: int) -> None:
    dst[offset : offset + page_ids.numel()].copy_(page_ids, non_blocking=True)


class KVReceiver:
    def __init__(self, backend: DecodeAttnBackend, transfer: TransferEngine) -> None:
        self.backend = backend
        self.transfer = transfer
        self.arrived: Dict[str, KVPageHandle] = {}

    def on_pages(self, handle: KVPageHandle, offset: int) -> None:
        if handle.ticket is not None:
            self.transfer.wait_recv(handle.ticket)
        # pre-stage the request's page ids where its first replay will read them
        _scatter_page_ids(self.backend.kv_indices, handle.page_ids, offset)  # expect: FC104
        self.arrived[handle.request_id] = handle
