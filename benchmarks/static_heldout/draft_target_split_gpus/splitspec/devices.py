"""The two GPUs, their streams and events, and the hand-off of draft tokens."""
from __future__ import annotations

import torch


class DevicePair:
    def __init__(self, draft_device: torch.device, target_device: torch.device) -> None:
        assert draft_device != target_device, "draft and target must sit on different GPUs"  # expect: FC109
        self.draft_device = draft_device
        self.target_device = target_device
        self.draft_stream = torch.cuda.Stream(draft_device)
        self.target_stream = torch.cuda.Stream(target_device)
        with torch.cuda.device(draft_device):
            self.draft_done = torch.cuda.Event()
        with torch.cuda.device(target_device):
            self.verify_done = torch.cuda.Event()
        self._check_streams()

    def _check_streams(self) -> None:
        assert self.draft_stream.device != self.target_stream.device, "streams share a GPU"  # ok: FC109


def hand_off(tokens: torch.Tensor, pair: DevicePair) -> torch.Tensor:
    """Moves the draft tokens to the target GPU."""
    assert tokens.shape[1] > 0, "no draft tokens to hand off"  # expect: FC109
    torch.cuda.synchronize(pair.draft_device)  # expect: FC101
    return tokens.to(pair.target_device, non_blocking=True)
