"""A main/side stream pair: the shared expert runs on the side stream while the routed experts run on the main one."""

from __future__ import annotations

import torch


class SideStreamPair:
    def __init__(self, device: torch.device, side_priority: int = -1):
        self.device = device
        self.side_stream = torch.cuda.Stream(device=device, priority=side_priority)
        self.routed_ready_event = torch.cuda.Event()
        self.shared_done_event = torch.cuda.Event()
        self._forked = False

    def fork(self) -> None:
        """The side stream waits for the hidden states the main stream produced."""
        self._assert_joined()
        self._forked = True
        self.routed_ready_event.record(torch.cuda.current_stream(self.device))
        self.side_stream.wait_event(self.routed_ready_event)

    def join(self) -> None:
        """The main stream waits for the shared expert before adding its output."""
        self.shared_done_event.record(self.side_stream)
        torch.cuda.current_stream(self.device).wait_event(self.shared_done_event)  # ok: FC101
        self._forked = False

    def _assert_joined(self) -> None:
        assert not self._forked, "side stream forked twice without a join"  # ok: FC109
