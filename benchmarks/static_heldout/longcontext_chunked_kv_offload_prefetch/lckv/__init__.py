"""Million-token decode with a device KV window over host-resident pages."""

from lckv.config import OffloadConfig
from lckv.host_pool import HostPagePool, LongRequest
from lckv.window import DeviceWindow, SlotRemapper, WindowView
from lckv.prefetch import PrefetchScheduler

__all__ = ["OffloadConfig", "HostPagePool", "LongRequest", "DeviceWindow", "SlotRemapper", "WindowView",
           "PrefetchScheduler"]
