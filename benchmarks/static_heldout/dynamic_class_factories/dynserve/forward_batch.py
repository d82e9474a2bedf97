"""What one step hands the model: the scheduler's numpy batch, its device/pinned form, and the
attention metadata each backend builds from it."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from .buffers import HostView


class ForwardMode(enum.IntEnum):
    IDLE = 0
    DECODE = 1
    EXTEND = 2
    TARGET_VERIFY = 3

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_extend(self) -> bool:
        return self == ForwardMode.EXTEND

    def is_verify(self) -> bool:
        return self == ForwardMode.TARGET_VERIFY


@dataclass
class ScheduledBatch:
    """The scheduler's decision for one step, all on the host."""

    mode: ForwardMode
    input_ids: np.ndarray
    positions: np.ndarray
    out_cache_loc: np.ndarray
    seq_lens: np.ndarray
    extend_lens: np.ndarray
    page_table: np.ndarray
    has_prefix: bool = False
    temperatures: Optional[np.ndarray] = None


@dataclass
class ForwardBatch:
    mode: ForwardMode
    batch_size: int
    num_tokens: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    qo_indptr: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    page_table_cpu: np.ndarray
    max_extend_len: int = 1
    has_prefix: bool = False
    temperatures: Optional[torch.Tensor] = None
    greedy_rows: Optional[torch.Tensor] = None

    # an int-friendly copy of the device lengths for kernels that take max lengths as arguments
    host_seq_lens = HostView("seq_lens")

    @classmethod
    def from_schedule(cls, sched: ScheduledBatch, device: torch.device) -> "ForwardBatch":
        bs = len(sched.seq_lens)
        seq_lens_cpu = torch.from_numpy(sched.seq_lens.astype(np.int32)).pin_memory()
        qo_indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32, pin_memory=True)
        qo_indptr_cpu[1:] = torch.from_numpy(np.cumsum(sched.extend_lens, dtype=np.int32))
        temperatures = greedy_rows = None
        if sched.temperatures is not None:
            temperatures = torch.from_numpy(sched.temperatures).to(device, non_blocking=True)
            greedy_rows = torch.from_numpy(sched.temperatures == 0.0).to(device, non_blocking=True)
        return cls(
            mode=sched.mode,
            batch_size=bs,
            num_tokens=len(sched.input_ids),
            input_ids=torch.from_numpy(sched.input_ids).to(device, non_blocking=True),
            positions=torch.from_numpy(sched.positions).to(device, non_blocking=True),
            out_cache_loc=torch.from_numpy(sched.out_cache_loc).to(device, non_blocking=True),
            seq_lens=seq_lens_cpu.to(device, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu,
            qo_indptr=qo_indptr_cpu.to(device, non_blocking=True),
            qo_indptr_cpu=qo_indptr_cpu,
            page_table_cpu=sched.page_table,
            max_extend_len=int(sched.extend_lens.max()) if bs else 0,
            has_prefix=sched.has_prefix,
            temperatures=temperatures,
            greedy_rows=greedy_rows,
        )


class StepMetadata:
    """Attention metadata of one step (or of one captured bucket); built fresh each time."""

    __slots__ = ("mode", "batch_size", "decode_wrapper", "prefill_wrapper", "block_tables", "cu_kv_lens",
                 "num_kv_pages")

    def __init__(self, mode: ForwardMode, batch_size: int) -> None:
        self.mode = mode
        self.batch_size = batch_size
        self.decode_wrapper = None
        self.prefill_wrapper = None
        self.block_tables: Optional[torch.Tensor] = None
        self.cu_kv_lens: Optional[torch.Tensor] = None
        self.num_kv_pages = 0
