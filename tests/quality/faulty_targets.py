"""Faulty variants of the CPU reference target: each plants one serving bug the fuzzer must find.

They are importable by name (``faulty_targets:StaleLastPageLen``) so that a reproducer replays them in a fresh
process; the test adds this directory to ``PYTHONPATH`` there.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flashcheck.layout import PagedLayout
from flashcheck.targets.reference import ReferenceTarget


class StaleLastPageLen(ReferenceTarget):
    """Replay forgets to refresh ``kv_last_page_len``: the graph keeps the values of the captured batch (FC303)."""

    name = "stale-last-page-len"
    _in_capture = False

    def capture(self, bucket: int, layout: PagedLayout, q: Any) -> None:
        self._in_capture = True  # capture writes every buffer
        try:
            super().capture(bucket, layout, q)
        finally:
            self._in_capture = False

    def prepare_replay(self, bucket: int, layout: PagedLayout) -> None:
        if self._in_capture:
            super().prepare_replay(bucket, layout)
            return
        saved = self.bufs[bucket]["kv_last_page_len"].clone()
        super().prepare_replay(bucket, layout)
        self.bufs[bucket]["kv_last_page_len"].copy_(saved)  # the bug: not part of the per-step update


class PollutedIndptr(ReferenceTarget):
    """The captured forward writes the persistent ``kv_indptr``; the host side only rewrites entries it
    believes changed (a mirror of what it last wrote), so the pollution survives until the next replay (FC301)."""

    name = "polluted-indptr"

    def capture(self, bucket: int, layout: PagedLayout, q: Any) -> None:
        self._mirror = getattr(self, "_mirror", {})
        self._mirror.pop(bucket, None)  # capture writes every buffer in full
        super().capture(bucket, layout, q)
        self._mirror[bucket] = layout.kv_indptr.copy()

    def prepare_replay(self, bucket: int, layout: PagedLayout) -> None:
        mirror = getattr(self, "_mirror", {}).get(bucket)
        if mirror is None:
            super().prepare_replay(bucket, layout)
            return
        b, t = self.bufs[bucket], self.torch
        indptr = b["kv_indptr"].clone()
        super().prepare_replay(bucket, layout)
        changed = np.flatnonzero(layout.kv_indptr != mirror)
        indptr[t.as_tensor(changed, dtype=t.long)] = t.as_tensor(layout.kv_indptr[changed])
        b["kv_indptr"].copy_(indptr)  # only "changed" entries were written
        self._mirror[bucket] = layout.kv_indptr.copy()

    def after_replay(self, bucket: int) -> None:
        self.bufs[bucket]["kv_indptr"][0] = 3  # the graph scribbles on a buffer the host thinks it owns


class PlanInfoVaries(ReferenceTarget):
    """The re-plan before replay picks a schedule from the real batch size, not the bucket (FC304)."""

    name = "plan-info-varies"

    def plan_info(self, bucket: int) -> list[int] | None:
        g = self._graphs.get(bucket)
        return [bucket, self.chunk, g.real_batch if g is not None else 0]
