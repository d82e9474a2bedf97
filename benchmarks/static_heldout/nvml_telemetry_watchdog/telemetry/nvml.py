"""A thin NVML shim; falls back to torch's allocator view where pynvml is missing."""

from dataclasses import dataclass

import torch

try:
    import pynvml
except ImportError:  # pragma: no cover - containers without the NVML bindings
    pynvml = None


@dataclass
class DeviceSample:
    index: int
    used_bytes: int
    free_bytes: int
    util_gpu: int = 0
    temperature_c: int = 0
    power_mw: int = 0


class NvmlShim:
    def __init__(self):
        self.available = pynvml is not None
        self.handles = []
        if self.available:
            pynvml.nvmlInit()
            self.count = pynvml.nvmlDeviceGetCount()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(self.count)]
        else:
            self.count = torch.cuda.device_count()

    def query(self, device_index: int) -> DeviceSample:
        assert 0 <= device_index < self.count, "no such device"  # expect: FC109
        if not self.available:
            free, total = torch.cuda.mem_get_info(device_index)
            return DeviceSample(device_index, total - free, free)
        h = self.handles[device_index]
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        util = pynvml.nvmlDeviceGetUtilizationRates(h)
        return DeviceSample(
            device_index,
            mem.used,
            mem.free,
            util.gpu,
            pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
            pynvml.nvmlDeviceGetPowerUsage(h),
        )

    def free_bytes(self, device_index: int) -> int:
        return self.query(device_index).free_bytes
