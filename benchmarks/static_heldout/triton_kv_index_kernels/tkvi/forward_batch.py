"""Per-step batch handed from the scheduler to the model runner (SGLang's ScheduleBatch -> ForwardBatch)."""

from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING, List, Optional

import torch

if TYPE_CHECKING:
    from tkvi.attention.flashinfer_backend import FlashInferAttnBackend
    from tkvi.model_runner import ModelRunner


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2
    MIXED = 3
    IDLE = 4

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_extend(self) -> bool:
        return self in (ForwardMode.EXTEND, ForwardMode.MIXED)


@dataclasses.dataclass
class ScheduleBatch:
    """What the scheduler decided for this step; host data only."""

    forward_mode: ForwardMode
    rids: List[str]
    req_pool_indices: List[int]
    input_ids: List[int]
    seq_lens: List[int]
    out_cache_loc: List[int]
    prefix_lens: List[int] = dataclasses.field(default_factory=list)
    extend_lens: List[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class ForwardBatch:
    """Device tensors for the model plus the host mirrors the planners read (``*_cpu``)."""

    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    seq_lens_sum: int
    out_cache_loc: torch.Tensor
    extend_seq_lens: Optional[torch.Tensor] = None
    extend_seq_lens_cpu: Optional[torch.Tensor] = None
    extend_prefix_lens: Optional[torch.Tensor] = None
    extend_prefix_lens_cpu: Optional[torch.Tensor] = None
    extend_num_tokens: Optional[int] = None
    # scratch the prefill planner fills with page ids; lives for one step
    kv_indices: Optional[torch.Tensor] = None
    attn_backend: Optional["FlashInferAttnBackend"] = None

    @classmethod
    def init_new(cls, batch: ScheduleBatch, model_runner: "ModelRunner") -> "ForwardBatch":
        device = model_runner.device
        bs = len(batch.req_pool_indices)
        seq_lens_cpu = torch.tensor(batch.seq_lens, dtype=torch.int32)
        seq_lens = seq_lens_cpu.to(device, non_blocking=True)
        req_pool_indices = torch.tensor(batch.req_pool_indices, dtype=torch.int64).to(device, non_blocking=True)
        input_ids = torch.tensor(batch.input_ids, dtype=torch.int64).to(device, non_blocking=True)
        out_cache_loc = torch.tensor(batch.out_cache_loc, dtype=torch.int64).to(device, non_blocking=True)

        if batch.forward_mode.is_decode():
            positions = (seq_lens - 1).to(torch.int64)
        else:
            extend_lens_cpu = torch.tensor(batch.extend_lens, dtype=torch.int32)
            extend_lens = extend_lens_cpu.to(device, non_blocking=True)
            extend_num_tokens = sum(batch.extend_lens)
            prefix_lens = torch.tensor(batch.prefix_lens, dtype=torch.int32).to(device, non_blocking=True)
            # token -> request map built on the device; output_size keeps the total on the host side
            token_req = torch.repeat_interleave(torch.arange(bs, device=device), extend_lens, output_size=extend_num_tokens)  # ok: FC101
            qo_start = torch.cumsum(extend_lens, dim=0) - extend_lens
            token_offset = torch.arange(extend_num_tokens, device=device) - qo_start[token_req]
            positions = (token_offset + prefix_lens[token_req]).to(torch.int64)

        ret = cls(
            forward_mode=batch.forward_mode,
            batch_size=bs,
            input_ids=input_ids,
            positions=positions,
            req_pool_indices=req_pool_indices,
            seq_lens=seq_lens,
            seq_lens_cpu=seq_lens_cpu,
            seq_lens_sum=sum(batch.seq_lens),
            out_cache_loc=out_cache_loc,
        )
        if not batch.forward_mode.is_decode():
            ret.extend_seq_lens = extend_lens
            ret.extend_seq_lens_cpu = extend_lens_cpu
            ret.extend_prefix_lens = prefix_lens
            ret.extend_prefix_lens_cpu = torch.tensor(batch.prefix_lens, dtype=torch.int32)
            ret.extend_num_tokens = extend_num_tokens
        return ret
