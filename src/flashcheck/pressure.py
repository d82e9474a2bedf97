"""Device-side delays: keep the current CUDA stream busy for a given number of microseconds.

`AsyncPressure` is the driver's ``--async-pressure-us``: a delay enqueued before each host-side preparation step
(``plan``, ``prepare_replay``) so the target's host work overlaps the device as in an overlapped scheduler, and a
copy the host does not wait for is still queued when the host moves on. The staging layer (FC204) uses the same
delay to hold each tracked copy in flight. The delay is ``torch.cuda._sleep`` (a spin kernel counting clock cycles),
calibrated to microseconds once per process. torch is imported only when a delay is made.
"""

from __future__ import annotations

import importlib
import math
from typing import Any

from flashcheck.errors import InvalidArgument

__all__ = ["MAX_PRESSURE_US", "AsyncPressure", "cycles_per_us", "hold_stream", "parse_pressure_us"]

MAX_PRESSURE_US = 1_000_000.0  # one second per step is far past any overlap an engine has; beyond it is a typo
_CALIBRATION_CYCLES = 20_000_000
_CLOCK: dict[str, float] = {}  # "cycles_per_us" once measured


def parse_pressure_us(value: object, *, option: str = "--async-pressure-us") -> float | None:
    """The delay in microseconds (None or 0: off). A value that is not a finite number in [0, 1e6] is a usage
    error naming the option."""
    if value is None:
        return None
    try:
        us = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InvalidArgument(f"{option} {value!r}: give a number of microseconds, e.g. {option} 200") from None
    if not math.isfinite(us) or us < 0 or us > MAX_PRESSURE_US:
        raise InvalidArgument(
            f"{option} {value!r}: must be between 0 and {MAX_PRESSURE_US:.0f} microseconds (0 turns it off)"
        )
    return us or None


def cycles_per_us() -> float:
    """GPU clock cycles per microsecond of ``torch.cuda._sleep``, measured once per process with CUDA events (this
    synchronizes: call it outside watched regions)."""
    if "cycles_per_us" not in _CLOCK:
        torch: Any = importlib.import_module("torch")
        torch.cuda._sleep(1000)  # load the kernel
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(_CALIBRATION_CYCLES)
        end.record()
        end.synchronize()
        ms = max(start.elapsed_time(end), 1e-3)
        _CLOCK["cycles_per_us"] = _CALIBRATION_CYCLES / (ms * 1000.0)
    return _CLOCK["cycles_per_us"]


def hold_stream(us: float, torch: Any = None) -> None:
    """Enqueue a delay of about `us` microseconds on the current CUDA stream (returns at once)."""
    if torch is None:
        torch = importlib.import_module("torch")
    torch.cuda._sleep(max(1, int(us * cycles_per_us())))


class AsyncPressure:
    """What the driver calls before each host-side preparation step. Off (``us`` None or 0): does nothing."""

    def __init__(self, us: float | None, *, device: str) -> None:
        self.us = parse_pressure_us(us)
        self.active = self.us is not None and str(device).startswith("cuda")
        self._torch: Any = None

    def calibrate(self) -> None:
        """Measure the clock once, outside every watched region (it synchronizes)."""
        if self.active:
            import torch

            self._torch = torch
            cycles_per_us()

    def before_host_prep(self) -> None:
        if self.active and self.us is not None:
            hold_stream(self.us, self._torch)
