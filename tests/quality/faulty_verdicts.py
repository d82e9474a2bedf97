"""CPU analogs of the engine bugs whose verdicts must never read as skipped or clean: a hang (interruptible and not),
a backend error on valid input, a kernel fault that first surfaces in flashcheck's own reads, an output-contract
violation and an eager-path host sync. Each is importable by name (``faulty_verdicts:Class``) for worker processes.

The GPU originals are in ``faulty_engine_gpu.py``; these exercise the same mechanisms in CI.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from flashcheck.layout import PagedLayout
from flashcheck.scenario import Step
from flashcheck.targets.reference import ReferenceTarget

SMALL: dict[str, Any] = {"max_kv_len": 256, "chunk": 32, "max_pages": 256}
# a bucket captured, a replay of it that faults (`FaultSurfacesLater`, bs >= 2), then steps that need a fresh worker
FAULT_THEN_GO_ON = (
    Step("capture", (1, 1), (9, 17), bucket=2),
    Step("replay", (1, 1), (9, 17), bucket=2),
    Step("replay", (1,), (40,), bucket=1),
    Step("eager", (2,), (30,)),
)


class SpinsInPrepareReplay(ReferenceTarget):
    """A replay preparation that waits forever on a condition no one sets (a busy loop in Python): FC252.
    The watchdog interrupts it and the session goes on."""

    name = "spins-in-prepare-replay"
    intended: ClassVar[tuple[str, ...]] = ("FC252",)

    def prepare_replay(self, bucket: int, layout: PagedLayout) -> None:
        super().prepare_replay(bucket, layout)
        if layout.batch_size in (3, 5) and not getattr(self, "_capturing", False):
            while True:  # BUG: waits for a flag the previous step never set
                pass

    def capture(self, bucket: int, layout: PagedLayout, q: Any) -> None:
        self._capturing = True
        try:
            super().capture(bucket, layout, q)
        finally:
            self._capturing = False


class BlocksInReplay(ReferenceTarget):
    """A replay that blocks where Python cannot interrupt it (as a spinning kernel blocks a CUDA synchronize):
    FC252 only through a worker process whose watchdog writes the stacks and exits."""

    name = "blocks-in-replay"
    intended: ClassVar[tuple[str, ...]] = ("FC252",)

    def replay(self, bucket: int, q: Any) -> Any:
        if q.shape[0] >= 3:
            time.sleep(10**6)  # BUG: uninterruptible wait (the async exception is checked only between bytecodes)
        return super().replay(bucket, q)


class RaisesOnValidInput(ReferenceTarget):
    """The engine re-plans its graph wrapper with the real batch instead of the bucket, and the backend raises the
    ``ValueError`` FlashInfer raises for it: FC250 "raised on valid input", never a rejected step."""

    name = "raises-on-valid-input"
    intended: ClassVar[tuple[str, ...]] = ("FC250",)

    def prepare_replay(self, bucket: int, layout: PagedLayout) -> None:
        super().prepare_replay(bucket, layout)
        if layout.batch_size != bucket:  # BUG: planned with layout.batch_size, not the bucket
            raise ValueError(
                f"The batch size should be fixed in cudagraph mode, the runtime batch size {layout.batch_size} "
                f"mismatches the batch size set during initialization {bucket}"
            )


class _FaultedTensor:
    """A tensor whose data faulted on the device: its metadata reads fine, any use raises the CUDA error (as an
    illegal memory access surfaces at the next synchronizing read)."""

    def __init__(self, t: Any) -> None:
        self.shape, self.dtype, self.device = t.shape, t.dtype, t.device

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


class FaultSurfacesLater(ReferenceTarget):
    """A replayed kernel faults asynchronously; the error surfaces only when flashcheck reads the output: FC250
    attributed to the replay, the session marked poisoned."""

    name = "fault-surfaces-later"
    intended: ClassVar[tuple[str, ...]] = ("FC250",)

    def replay(self, bucket: int, q: Any) -> Any:
        out = super().replay(bucket, q)
        return _FaultedTensor(out) if q.shape[0] >= 2 else out  # BUG: reads past kv_indices for bs >= 2


class ExtraPaddedRow(ReferenceTarget):
    """A graph runner slices the static output with one padded row too many: FC305."""

    name = "extra-padded-row"
    intended: ClassVar[tuple[str, ...]] = ("FC305",)

    def replay(self, bucket: int, q: Any) -> Any:
        g, b = self._graphs[bucket], self.bufs[bucket]
        self.static_q[: q.shape[0]].copy_(q)
        out = self._attend(
            self.static_q, b["qo_indptr"], b["kv_indptr"], self.kv_indices, b["kv_last_page_len"], bucket
        )
        return out[: g.real_rows + 1]  # BUG: one padded row too many


class EagerHostSync(ReferenceTarget):
    """The eager metadata build reads sequence lengths back from the device every step (``seq_lens.cpu()``):
    FC201 in the ``plan`` region. Device tensors are simulated (`flashcheck.runtime.simdevice`)."""

    name = "eager-host-sync"
    intended: ClassVar[tuple[str, ...]] = ("FC201",)

    def plan(self, layout: PagedLayout) -> None:
        from flashcheck.runtime.simdevice import as_device

        seq_lens = as_device(self.torch.as_tensor(layout.seq_lens))
        self._max_len = int(seq_lens.cpu().max())  # BUG: a device-to-host copy on every eager step
        super().plan(layout)


VERDICT_TARGETS: dict[str, type[ReferenceTarget]] = {
    c.name: c for c in (SpinsInPrepareReplay, RaisesOnValidInput, FaultSurfacesLater, ExtraPaddedRow, EagerHostSync)
}


class RejectsEveryInput(ReferenceTarget):
    """A target whose declared input contract excludes every batch: each step is a counted skip, no property ever
    sees an output or a replay, and a run against it must read as incomplete, never as clean."""

    name = "rejects-every-input"
    intended: ClassVar[tuple[str, ...]] = ()

    def accepts(self, spec: Any) -> str | None:
        return "this target serves no batch at all"
