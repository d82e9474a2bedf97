"""Open conversations: one slot each, a fixed ring of temporal KV pages per slot."""

from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np

from duplex.settings import DuplexSettings


class SessionTable:
    def __init__(self, settings: DuplexSettings):
        self.settings = settings
        self.page_size = settings.page_size
        self.pages_per_session = settings.pages_per_session
        self.context_frames = settings.context_frames
        self.frame_count_np = np.zeros(settings.max_sessions, dtype=np.int64)
        self.slot_of: Dict[str, int] = {}
        self.free_slots: List[int] = list(range(settings.max_sessions - 1, -1, -1))
        self.num_open = 0

    def open(self, session_id: str, voice_prompt_frames: int) -> int:
        assert voice_prompt_frames < self.context_frames, "voice prompt longer than the context"  # expect: FC109
        if not self.free_slots:
            raise RuntimeError("all session slots are taken")
        slot = self.free_slots.pop()
        self.slot_of[session_id] = slot
        self.frame_count_np[slot] = voice_prompt_frames
        self.num_open += 1
        return slot

    def close(self, session_id: str) -> None:
        slot = self.slot_of.pop(session_id)
        self.frame_count_np[slot] = 0
        self.free_slots.append(slot)
        self.num_open -= 1

    def check(self) -> None:
        assert self.num_open == len(self.slot_of)  # ok: FC109

    def page_lists(self, slots_np: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Pages each slot attends to this frame (the frame being written included).

        Slot ``s`` owns pages ``[s * P, (s + 1) * P)``; frame ``f`` lives at ring position ``f % (P * page_size)``.
        Keys carry their rotation, so the ring order does not matter to attention.
        """
        ps, P = self.page_size, self.pages_per_session
        frames = self.frame_count_np[slots_np] + 1
        live = np.minimum(frames, P * ps)
        counts = -(-live // ps)
        indptr = np.zeros(len(slots_np) + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr[1:])
        indices = np.concatenate([s * P + np.arange(c) for s, c in zip(slots_np.tolist(), counts.tolist())])
        last = np.where(frames >= P * ps, ps, (live - 1) % ps + 1).astype(np.int32)
        return indptr, indices.astype(np.int32), last
