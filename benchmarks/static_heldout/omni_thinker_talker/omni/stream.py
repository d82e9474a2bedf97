"""Thinker hidden states streamed to the talker through a ring of pinned host buffers."""

import flashcheck
import torch


class HiddenStream:
    def __init__(self, num_slots: int, hidden_size: int, max_tokens: int, dtype: torch.dtype):
        assert num_slots >= 2, "the talker reads one slot while the thinker fills the next"  # expect: FC109
        self.num_slots = num_slots
        self.hidden_size = hidden_size
        self.dtype = dtype
        self._backend = "pinned-ring"
        self.ring_host = torch.empty(num_slots, max_tokens, hidden_size, dtype=dtype, pin_memory=True)
        self.head = 0
        self.tail = 0

    def _check_capacity(self) -> None:
        assert self.head - self.tail < self.num_slots, "talker fell behind the thinker"  # ok: FC109

    @flashcheck.hot_path
    def push(self, hidden: torch.Tensor) -> int:
        n = hidden.shape[0]
        self._check_capacity()
        if self.ring_host.shape[1] < n:
            self.ring_host = torch.empty(  # ok: FC107
                self.num_slots, n, self.hidden_size, dtype=self.dtype, pin_memory=True
            )
        slot = self.head % self.num_slots
        self.ring_host[slot, :n].copy_(hidden)  # expect: FC101
        self.head += 1
        return slot

    def release(self, slot: int) -> None:
        self.tail += 1
