"""Split the GPU's SMs between the prefill and decode workers."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Tuple

import torch

logger = logging.getLogger(__name__)

_SMS_PER_TPC = 2


@dataclass(frozen=True)
class SMPartition:
    name: str
    num_sms: int


def _round_to_tpc(n: int) -> int:
    return max(_SMS_PER_TPC, n - n % _SMS_PER_TPC)


def make_partitions(total_sms: int, prefill_frac: float) -> Tuple[SMPartition, SMPartition]:
    assert 0.0 < prefill_frac < 1.0, "each worker needs some SMs"  # expect: FC109
    pf = _round_to_tpc(int(total_sms * prefill_frac))
    return SMPartition("prefill", pf), SMPartition("decode", total_sms - pf)


class PartitionedStreams:
    """One stream per partition. With green contexts each stream only sees its partition's SMs."""

    def __init__(self, device: torch.device, prefill: SMPartition, decode: SMPartition):
        self.device = device
        self.partitions = (prefill, decode)
        self.green = False
        try:
            from torch.cuda import green_contexts  # type: ignore[attr-defined]

            self._gc_prefill = green_contexts.GreenContext.create(prefill.num_sms, device.index or 0)
            self._gc_decode = green_contexts.GreenContext.create(decode.num_sms, device.index or 0)
            self.prefill = self._gc_prefill.Stream()
            self.decode = self._gc_decode.Stream()
            self.green = True
        except (ImportError, AttributeError, RuntimeError) as e:
            logger.warning("green contexts unavailable (%s); falling back to prioritized streams", e)
            self.prefill = torch.cuda.Stream(device, priority=0)
            self.decode = torch.cuda.Stream(device, priority=-1)
