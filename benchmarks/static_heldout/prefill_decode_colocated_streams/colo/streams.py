"""The two streams of the engine and the events that order them."""
from __future__ import annotations

import torch


class StreamPair:
    def __init__(self, device: torch.device, priority: int = 0):
        assert priority in (-1, 0), "CUDA stream priority must be -1 (high) or 0"  # expect: FC109
        self.prefill = torch.cuda.Stream(device=device, priority=0)
        self.decode = torch.cuda.Stream(device=device, priority=priority)
        self.prefill_done = torch.cuda.Event()
        self.decode_done = torch.cuda.Event()

    def order_decode_after_prefill(self) -> None:
        """Decode reads KV pages that the last prefill wrote; order it on the device."""
        self.decode.wait_event(self.prefill_done)  # ok: FC101

    def handoff_to_decode(self) -> None:
        """Requests that finished prefill join the decode batch: their KV must be complete."""
        self.prefill.synchronize()  # expect: FC101

    def join_current(self) -> None:
        cur = torch.cuda.current_stream()
        cur.wait_stream(self.prefill)
        cur.wait_stream(self.decode)
