from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DeviceCaps:
    sm: int
    num_sms: int
    total_mem: int
    has_fp8: bool
    trtllm_max_kv_len: int = 131072

    @property
    def is_blackwell(self) -> bool:
        return self.sm >= 100


def detect_caps(device: torch.device) -> DeviceCaps:
    props = torch.cuda.get_device_properties(device)
    sm = props.major * 10 + props.minor
    return DeviceCaps(sm=sm, num_sms=props.multi_processor_count, total_mem=props.total_memory, has_fp8=sm >= 89)
