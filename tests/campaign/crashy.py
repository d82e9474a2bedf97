"""Targets that misbehave on purpose, loaded by campaign workers as ``crashy:ClassName`` (this directory is on
the workers' sys.path because the supervisor forwards its own).

Each crash fires on one specific batch shape so a campaign meets it a few times in a short budget.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from flashcheck.layout import PagedLayout
from flashcheck.targets.reference import ReferenceTarget


def exit_shape(layout: PagedLayout) -> bool:
    """Graph batches of 3 real requests whose first kv_len is a multiple of 3."""
    return layout.batch_size == 3 and layout.spec.kv_lens[0] % 3 == 0


def kill_shape(layout: PagedLayout) -> bool:
    """Eager batches of 5 requests whose first kv_len is even."""
    return layout.spec.batch_size == 5 and layout.spec.kv_lens[0] % 2 == 0


class ExitOnShape(ReferenceTarget):
    """Exits the process with status 3 in prepare_replay on `exit_shape` (a fatal error in a metadata builder)."""

    name = "crashy-exit"

    def prepare_replay(self, bucket: int, layout: PagedLayout) -> None:
        if exit_shape(layout):
            os._exit(3)
        super().prepare_replay(bucket, layout)


class CrashTwoWays(ExitOnShape):
    """`ExitOnShape`, and SIGKILLs itself when planning an eager `kill_shape` batch (a hard kernel fault)."""

    name = "crashy-two"

    def plan(self, layout: PagedLayout) -> None:
        if kill_shape(layout):
            os.kill(os.getpid(), signal.SIGKILL)
        super().plan(layout)


class HangOnShape(ReferenceTarget):
    """Never returns from prepare_replay on `exit_shape` (a deadlocked kernel)."""

    name = "crashy-hang"

    def prepare_replay(self, bucket: int, layout: PagedLayout) -> None:
        if exit_shape(layout):
            time.sleep(3600)
        super().prepare_replay(bucket, layout)


class Polluting(ReferenceTarget):
    """A metadata builder that corrupts the persistent kv_indptr of large buckets (ordinary FC301 findings)."""

    name = "polluting"

    def prepare_replay(self, bucket: int, layout: PagedLayout) -> None:
        super().prepare_replay(bucket, layout)
        buf: Any = self.bufs[bucket]["kv_indptr"]
        if bucket >= 4:
            buf[1] = buf[-1] + 3


class Mixed(CrashTwoWays, Polluting):
    """Both kinds of crash and an ordinary FC301 finding: what the kill-and-resume test runs."""

    name = "crashy-mixed"


class ExitOnceOnSixthCall(ReferenceTarget):
    """Exits with status 3 on its sixth plan/capture/prepare_replay call, once per campaign: the file named by
    $CRASHY_MARKER records that it did, so the restarted worker runs on (the crash lands mid-chunk, not at step 0)."""

    name = "crashy-once"
    calls = 0

    def _count(self) -> None:
        marker = os.environ.get("CRASHY_MARKER", "")
        type(self).calls += 1
        if marker and type(self).calls == 6 and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(3)

    def plan(self, layout: PagedLayout) -> None:
        self._count()
        super().plan(layout)

    def capture(self, bucket: int, layout: PagedLayout, q: Any) -> None:
        self._count()
        super().capture(bucket, layout, q)

    def prepare_replay(self, bucket: int, layout: PagedLayout) -> None:
        self._count()
        super().prepare_replay(bucket, layout)


# Small shapes keep CPU steps in the milliseconds (pass as --target-config).
SMALL = '{"max_kv_len": 96, "max_pages": 64, "max_qo_len": 4}'


_CAPTURES = [0]  # captures this worker process has run (a JIT compile happens in the first of each kind)


class SlowFirstCapture(ReferenceTarget):
    """The first capture of each worker process takes `SLOW_SECONDS`, as a first-use JIT compile of the backend's
    kernels does: longer than the step timeout, shorter than the warm-up leash (not a hang)."""

    name = "crashy-slow-first"
    slow_call = 1

    def capture(self, bucket: int, layout: PagedLayout, q: Any) -> None:
        _CAPTURES[0] += 1
        if _CAPTURES[0] == self.slow_call:
            time.sleep(SLOW_SECONDS)
        super().capture(bucket, layout, q)


class SlowSecondCapture(SlowFirstCapture):
    """The same delay in the second capture of each process: no compile is left to explain it, a hang."""

    name = "crashy-slow-second"
    slow_call = 2


class SlowSetup(ReferenceTarget):
    """Setting the target up takes `SLOW_SECONDS` in each worker process, as compiling its kernels when the session
    opens does: longer than the step timeout, shorter than the warm-up leash (not a dead worker)."""

    name = "crashy-slow-setup"

    def setup(self, env: Any) -> None:
        if not _SETUPS:
            _SETUPS.append(1)
            time.sleep(SLOW_SECONDS)
        super().setup(env)


_SETUPS: list[int] = []


class HangEveryCapture(ReferenceTarget):
    """Every capture hangs (a kernel that never ends), the first of each worker process included, which runs on the
    warm-up leash."""

    name = "crashy-hang-capture"

    def capture(self, bucket: int, layout: PagedLayout, q: Any) -> None:
        time.sleep(3600)


SLOW_SECONDS = 2.6  # above a 2 s step timeout (the worker's watchdog at 1.2 s + 0.4 s grace), below 3x its 1.2 s
