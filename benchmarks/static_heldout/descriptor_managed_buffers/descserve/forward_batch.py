"""The per-step batch: what the scheduler decided, on the host and on the device."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import List, Optional

import torch
import torch.nn.functional as F

from .descriptors import HostSnapshot


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2
    MIXED = 3
    IDLE = 4

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_extend(self) -> bool:
        return self in (ForwardMode.EXTEND, ForwardMode.MIXED)


@dataclass
class ScheduledBatch:
    """What the scheduler hands the model runner: host data only."""

    forward_mode: ForwardMode
    input_ids: List[int]
    req_pool_indices: List[int]
    seq_lens: List[int]
    extend_lens: List[int]
    out_cache_loc: List[int]
    temperatures: List[float]
    use_cascade: bool = False
    shared_prefix_pages: int = 0
    prefix_kv_indices: List[int] = field(default_factory=list)
    suffix_kv_indptr: List[int] = field(default_factory=list)
    suffix_kv_indices: List[int] = field(default_factory=list)


class ForwardBatch:
    """One object per step (and one per captured batch size).

    Device tensors and their host twins live side by side; the ``*_cpu`` fields are the
    scheduler's own numbers and never come back from the GPU.
    """

    __slots__ = (
        "forward_mode",
        "batch_size",
        "input_ids",
        "positions",
        "req_pool_indices",
        "seq_lens",
        "seq_lens_cpu",
        "out_cache_loc",
        "extend_seq_lens",
        "extend_seq_lens_cpu",
        "extend_num_tokens",
        "max_extend_len",
        "logits_index",
        "use_cascade",
        "shared_prefix_pages",
        "prefix_kv_indices",
        "suffix_kv_indptr_cpu",
        "suffix_kv_indices",
        "sampling_temps",
    )

    # A host copy of the lengths for the step statistics.
    seq_lens_host = HostSnapshot("seq_lens")

    def __init__(
        self,
        *,
        forward_mode: ForwardMode,
        batch_size: int,
        input_ids: torch.Tensor,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        out_cache_loc: torch.Tensor,
        positions: Optional[torch.Tensor] = None,
        extend_seq_lens: Optional[torch.Tensor] = None,
        extend_seq_lens_cpu: Optional[torch.Tensor] = None,
        extend_num_tokens: int = 0,
        max_extend_len: int = 1,
        logits_index: Optional[torch.Tensor] = None,
        use_cascade: bool = False,
        shared_prefix_pages: int = 0,
        prefix_kv_indices: Optional[torch.Tensor] = None,
        suffix_kv_indptr_cpu: Optional[torch.Tensor] = None,
        suffix_kv_indices: Optional[torch.Tensor] = None,
        sampling_temps: Optional[List[float]] = None,
    ) -> None:
        self.forward_mode = forward_mode
        self.batch_size = batch_size
        self.input_ids = input_ids
        self.req_pool_indices = req_pool_indices
        self.seq_lens = seq_lens
        self.seq_lens_cpu = seq_lens_cpu
        self.out_cache_loc = out_cache_loc
        # decode: the new token sits at position seq_len - 1
        self.positions = positions if positions is not None else (seq_lens - 1).to(torch.int64)  # ok: FC107
        if extend_seq_lens_cpu is None:
            extend_seq_lens_cpu = torch.ones(batch_size, dtype=torch.int32)
        self.extend_seq_lens_cpu = extend_seq_lens_cpu
        self.extend_seq_lens = extend_seq_lens
        self.extend_num_tokens = extend_num_tokens or batch_size
        self.max_extend_len = max_extend_len
        self.logits_index = logits_index
        self.use_cascade = use_cascade
        self.shared_prefix_pages = shared_prefix_pages
        self.prefix_kv_indices = prefix_kv_indices
        self.suffix_kv_indptr_cpu = suffix_kv_indptr_cpu
        self.suffix_kv_indices = suffix_kv_indices
        self.sampling_temps = sampling_temps if sampling_temps is not None else [0.0] * batch_size

    @classmethod
    def from_schedule(cls, sched: ScheduledBatch, input_ids_cpu: torch.Tensor, device: torch.device) -> "ForwardBatch":
        def to_dev(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, non_blocking=True)

        bs = len(sched.seq_lens)
        seq_lens_cpu = torch.tensor(sched.seq_lens, dtype=torch.int32)
        extend_cpu = torch.tensor(sched.extend_lens, dtype=torch.int32)
        decode = sched.forward_mode.is_decode()
        positions = None
        if not decode:
            pos: List[int] = []
            for seq_len, ext in zip(sched.seq_lens, sched.extend_lens):
                pos.extend(range(seq_len - ext, seq_len))
            positions = to_dev(torch.tensor(pos, dtype=torch.int64))
        last = torch.cumsum(extend_cpu, 0) - 1
        cascade = {}
        if sched.use_cascade:
            cascade = dict(
                shared_prefix_pages=sched.shared_prefix_pages,
                prefix_kv_indices=to_dev(torch.tensor(sched.prefix_kv_indices, dtype=torch.int32)),
                suffix_kv_indptr_cpu=torch.tensor(sched.suffix_kv_indptr, dtype=torch.int32),
                suffix_kv_indices=to_dev(torch.tensor(sched.suffix_kv_indices, dtype=torch.int32)),
            )
        return cls(
            forward_mode=sched.forward_mode,
            batch_size=bs,
            input_ids=to_dev(input_ids_cpu),
            req_pool_indices=to_dev(torch.tensor(sched.req_pool_indices, dtype=torch.int64)),
            seq_lens=to_dev(seq_lens_cpu),
            seq_lens_cpu=seq_lens_cpu,
            out_cache_loc=to_dev(torch.tensor(sched.out_cache_loc, dtype=torch.int64)),
            positions=positions,
            extend_seq_lens=to_dev(extend_cpu),
            extend_seq_lens_cpu=extend_cpu,
            extend_num_tokens=len(sched.input_ids),
            max_extend_len=max(sched.extend_lens, default=1),
            logits_index=to_dev(last),
            use_cascade=sched.use_cascade,
            sampling_temps=sched.temperatures,
            **cascade,
        )

    # -- derived values --------------------------------------------------------------

    @property
    def seq_lens_sum(self) -> int:
        return int(self.seq_lens.sum())  # expect: FC101

    @property
    def seq_lens_sum_cpu(self) -> int:
        return int(self.seq_lens_cpu.sum())  # ok: FC101

    @property
    def seq_lens_max(self) -> int:
        return self.seq_lens.max().item()  # expect: FC101

    @property
    def qo_indptr(self) -> torch.Tensor:
        """Query offsets on the device, for kernels that read them there."""
        return F.pad(torch.cumsum(self.extend_seq_lens, 0, dtype=torch.int32), (1, 0))

    @property
    def qo_indptr_cpu(self) -> torch.Tensor:
        return F.pad(torch.cumsum(self.extend_seq_lens_cpu, 0, dtype=torch.int32), (1, 0))
