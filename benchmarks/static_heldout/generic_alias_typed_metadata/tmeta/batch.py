"""Per-step batch descriptions handed from the scheduler to the model runner."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Self, get_args

import torch

from tmeta.config import ForwardKind


@dataclass
class SamplingInfo:
    temperatures: torch.Tensor
    top_ps: torch.Tensor
    top_ks: torch.Tensor
    all_greedy: bool

    @classmethod
    def from_requests(
        cls,
        temperatures: list[float],
        top_ps: list[float],
        top_ks: list[int],
        device: torch.device,
    ) -> Self:
        return cls(
            temperatures=torch.tensor(temperatures, dtype=torch.float32, device=device),
            top_ps=torch.tensor(top_ps, dtype=torch.float32, device=device),
            top_ks=torch.tensor(top_ks, dtype=torch.int32, device=device),
            all_greedy=all(t <= 0.0 for t in temperatures),
        )


@dataclass
class ForwardBatch:
    kind: ForwardKind
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    extend_prefix_lens_cpu: Optional[torch.Tensor] = None
    extend_seq_lens_cpu: Optional[torch.Tensor] = None
    last_token_rows: Optional[torch.Tensor] = None
    sampling: Optional[SamplingInfo] = None

    @classmethod
    def from_host(
        cls,
        kind: ForwardKind,
        input_ids: list[int],
        positions: list[int],
        req_pool_indices: list[int],
        seq_lens: list[int],
        device: torch.device,
        prefix_lens: list[int] | None = None,
        sampling: SamplingInfo | None = None,
    ) -> Self:
        """Upload a scheduled batch; the lengths stay pinned on the host for planning."""
        assert kind in get_args(ForwardKind), f"unknown forward kind {kind!r}"  # expect: FC109
        seq_lens_cpu = torch.tensor(seq_lens, dtype=torch.int32).pin_memory()
        batch = cls(
            kind=kind,
            batch_size=len(seq_lens),
            input_ids=torch.tensor(input_ids, dtype=torch.int64, device=device),
            positions=torch.tensor(positions, dtype=torch.int64, device=device),
            req_pool_indices=torch.tensor(req_pool_indices, dtype=torch.int64, device=device),
            seq_lens=seq_lens_cpu.to(device, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu,
            sampling=sampling,
        )
        if kind == "extend":
            prefix = torch.tensor(prefix_lens or [0] * len(seq_lens), dtype=torch.int32)
            extend = seq_lens_cpu - prefix
            batch.extend_prefix_lens_cpu = prefix
            batch.extend_seq_lens_cpu = extend
            batch.last_token_rows = (torch.cumsum(extend, 0) - 1).to(device, non_blocking=True)
        return batch
