"""Stage-to-stage transfer of hidden states and residuals over NCCL."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)


@dataclass
class HiddenPacket:
    mb_id: int
    num_tokens: int
    hidden: torch.Tensor
    residual: torch.Tensor
    ready: torch.cuda.Event


class MicrobatchChannel:
    """One direction of a stage boundary: ``src_rank`` sends, ``dst_rank`` receives."""

    def __init__(self, src_rank: int, dst_rank: int, hidden_size: int, max_tokens: int,
                 dtype: torch.dtype, device, group=None):
        assert src_rank != dst_rank  # expect: FC109
        self.src_rank = src_rank
        self.dst_rank = dst_rank
        self.hidden_size = hidden_size
        self.max_tokens = max_tokens
        self.dtype = dtype
        self.device = torch.device(device)
        self.group = group
        self.stream = torch.cuda.Stream(device=self.device)
        # [num_tokens, mb_id]: NCCL moves device memory only, so the header lives there too
        self._header_dev = torch.zeros(2, dtype=torch.int64, device=self.device)
        self._send_buf: Optional[torch.Tensor] = None
        self._recv_buf: Optional[torch.Tensor] = None
        self._pending: List[Tuple[object, object]] = []
        self._inflight = 0

    def send_hidden(self, hidden: torch.Tensor, residual: torch.Tensor, mb_id: int) -> None:
        n = hidden.shape[0]
        if self._send_buf is None:
            self._send_buf = torch.empty((self.max_tokens, 2, self.hidden_size), dtype=self.dtype, device=self.device)  # ok: FC107
        self._send_buf[:n, 0].copy_(hidden)
        self._send_buf[:n, 1].copy_(residual)
        self._header_dev[0] = n
        self._header_dev[1] = mb_id
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            w_head = dist.isend(self._header_dev, self.dst_rank, group=self.group)
            w_body = dist.isend(self._send_buf[:n], self.dst_rank, group=self.group)
        self._pending.append((w_head, w_body))
        self._inflight += 1
        if len(self._pending) > 2:
            self._reap()

    def recv_hidden(self) -> HiddenPacket:
        dist.recv(self._header_dev, self.src_rank, group=self.group)
        n, mb_id = self._header_dev.tolist()  # expect: FC101
        if self._recv_buf is None or self._recv_buf.shape[0] < n:
            self._recv_buf = torch.empty((n, 2, self.hidden_size), dtype=self.dtype, device=self.device)  # expect: FC107
        ready = torch.cuda.Event()
        with torch.cuda.stream(self.stream):
            dist.recv(self._recv_buf[:n], self.src_rank, group=self.group)
            ready.record(self.stream)
        return HiddenPacket(mb_id, n, self._recv_buf[:n, 0], self._recv_buf[:n, 1], ready)

    def _reap(self) -> None:
        w_head, w_body = self._pending.pop(0)
        w_head.wait()
        w_body.wait()
        self._on_send_done()

    def _on_send_done(self) -> None:
        self._inflight -= 1
        assert self._inflight >= 0  # ok: FC109

    def close(self) -> None:
        while self._pending:
            self._reap()
        logger.info("channel %d->%d closed", self.src_rank, self.dst_rank)
