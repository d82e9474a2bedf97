"""Per-step batch description handed from the scheduler to the model runner."""
from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch

if TYPE_CHECKING:
    from .graph_runner import StaticInputs


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2
    TARGET_VERIFY = 3
    DRAFT_EXTEND = 4

    def is_extend(self) -> bool:
        return self == ForwardMode.EXTEND

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_target_verify(self) -> bool:
        return self == ForwardMode.TARGET_VERIFY

    def is_draft_extend(self) -> bool:
        return self == ForwardMode.DRAFT_EXTEND


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor          # [num_tokens] device
    positions: torch.Tensor          # [num_tokens] device
    seq_lens: torch.Tensor           # [bs] device, KV length after this step
    seq_lens_cpu: torch.Tensor       # [bs] host copy of seq_lens
    req_pool_indices: torch.Tensor   # [bs] device rows of req_to_page
    out_cache_loc: torch.Tensor      # [num_tokens] device KV slots written by this step
    temperatures: torch.Tensor       # [bs] device
    top_p: torch.Tensor              # [bs] device
    extend_seq_lens_cpu: Optional[torch.Tensor] = None
    min_seq_lens: Optional[torch.Tensor] = None
    tokens_per_req: int = 1
    use_graph: bool = False

    @functools.cached_property
    def max_seq_len(self) -> int:
        """Longest row, as trtllm-gen's max_seq_len."""
        return int(self.seq_lens.max())  # expect: FC101

    @functools.cached_property
    def max_seq_len_host(self) -> int:
        return int(self.seq_lens_cpu.max())  # ok: FC101

    @classmethod
    def for_capture(cls, mode: ForwardMode, bs: int, tokens_per_req: int, static: "StaticInputs") -> "ForwardBatch":
        """A batch over a graph runner's static inputs, as captured."""
        n = bs * tokens_per_req
        return cls(
            forward_mode=mode,
            batch_size=bs,
            input_ids=static.input_ids[:n],
            positions=static.positions[:n],
            seq_lens=static.seq_lens[:bs],
            seq_lens_cpu=static.seq_lens_cpu[:bs],
            req_pool_indices=static.req_pool_indices[:bs],
            out_cache_loc=static.out_cache_loc[:n],
            temperatures=static.temperatures[:bs],
            top_p=static.top_p[:bs],
            extend_seq_lens_cpu=torch.full((bs,), tokens_per_req, dtype=torch.int32),
            tokens_per_req=tokens_per_req,
            use_graph=True,
        )


@dataclass
class StepOutput:
    logits: torch.Tensor
    hidden: torch.Tensor
    next_tokens: torch.Tensor      # device
    host_tokens: torch.Tensor      # pinned, valid once `done` has completed
    done: torch.cuda.Event
