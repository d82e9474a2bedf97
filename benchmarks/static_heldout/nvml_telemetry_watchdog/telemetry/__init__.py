"""Device telemetry (NVML-like queries, allocator stats, step timing) and a hang watchdog."""

from telemetry.nvml import DeviceSample, NvmlShim
from telemetry.sampler import TelemetrySampler
from telemetry.timing import StepTimer
from telemetry.watchdog import Watchdog

__all__ = ["DeviceSample", "NvmlShim", "StepTimer", "TelemetrySampler", "Watchdog"]
