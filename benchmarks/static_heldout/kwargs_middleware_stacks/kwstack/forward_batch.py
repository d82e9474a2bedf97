"""Per-step batch description handed down every middleware stack."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2
    TARGET_VERIFY = 3
    DRAFT_EXTEND = 4
    IDLE = 5

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_extend(self) -> bool:
        return self == ForwardMode.EXTEND or self == ForwardMode.DRAFT_EXTEND

    def is_target_verify(self) -> bool:
        return self == ForwardMode.TARGET_VERIFY


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    out_cache_loc: torch.Tensor
    positions: torch.Tensor
    seq_lens_sum: int = 0
    extend_seq_lens: Optional[torch.Tensor] = None
    extend_seq_lens_cpu: Optional[List[int]] = None
    extend_prefix_lens_cpu: Optional[List[int]] = None
    use_graph: bool = False
    spec_info: Optional[Any] = None
    # Extra keyword arguments that middleware layers attach and forward (phase names, trace ids).
    call_kwargs: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        # The scheduler has always built consistent batches; this caught one bad merge in CI.
        assert self.seq_lens_cpu.shape[0] == self.batch_size  # expect: FC109
        if self.extend_seq_lens_cpu is not None and len(self.extend_seq_lens_cpu) != self.batch_size:
            raise ValueError(
                f"extend_seq_lens_cpu has {len(self.extend_seq_lens_cpu)} rows for batch_size={self.batch_size}"
            )

    @classmethod
    def for_capture(cls, bs: int, bufs: Dict[str, torch.Tensor], mode: ForwardMode = ForwardMode.DECODE):
        """A dummy batch over the graph runner's static input buffers."""
        return cls(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=bufs["input_ids"][:bs],
            req_pool_indices=bufs["req_pool_indices"][:bs],
            seq_lens=bufs["seq_lens"][:bs],
            seq_lens_cpu=bufs["seq_lens_cpu"][:bs],
            out_cache_loc=bufs["out_cache_loc"][:bs],
            positions=bufs["positions"][:bs],
            seq_lens_sum=bs,
            use_graph=True,
        )

    def plan_kwargs_host(self) -> Dict[str, Any]:
        """Host-side values a planner may need; nothing here lives on the GPU."""
        return {
            "seq_lens_cpu": self.seq_lens_cpu,
            "batch_size": self.batch_size,
            "seq_lens_sum": self.seq_lens_sum,
        }
