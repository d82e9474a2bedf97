"""Device-resident scheduling state: the waiting queue, the page free-list and the admission
counters are tensors on the GPU that kernels update in place; the host learns about them
through a pinned mirror that lands one step late."""

from drsched.config import DECODE_WORKSPACE_BYTES, SchedConfig
from drsched.counters import AdmissionCounters, CountMirror
from drsched.device_queue import DeviceRequestQueue, dump_queue_state
from drsched.freelist import DevicePageFreeList

__all__ = [
    "DECODE_WORKSPACE_BYTES",
    "SchedConfig",
    "AdmissionCounters",
    "CountMirror",
    "DeviceRequestQueue",
    "dump_queue_state",
    "DevicePageFreeList",
]
