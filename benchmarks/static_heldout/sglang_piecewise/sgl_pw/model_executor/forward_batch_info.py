"""ForwardMode and ForwardBatch (device tensors plus the host lists the scheduler already has)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, auto
from typing import TYPE_CHECKING, List, Optional

import torch

if TYPE_CHECKING:
    from sgl_pw.layers.attention.flashinfer_backend import FlashInferAttnBackend
    from sgl_pw.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool


class ForwardMode(IntEnum):
    EXTEND = auto()
    DECODE = auto()
    MIXED = auto()
    IDLE = auto()

    def is_extend(self) -> bool:
        return self in (ForwardMode.EXTEND, ForwardMode.MIXED)

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_idle(self) -> bool:
        return self == ForwardMode.IDLE


class CaptureHiddenMode(IntEnum):
    NULL = 0
    LAST = 1
    FULL = 2


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    out_cache_loc: torch.Tensor
    seq_lens_sum: int
    positions: Optional[torch.Tensor] = None
    seq_lens_cpu: Optional[torch.Tensor] = None
    extend_seq_lens: Optional[torch.Tensor] = None
    extend_prefix_lens: Optional[torch.Tensor] = None
    extend_start_loc: Optional[torch.Tensor] = None
    extend_seq_lens_cpu: Optional[List[int]] = None
    extend_prefix_lens_cpu: Optional[List[int]] = None
    extend_num_tokens: Optional[int] = None
    capture_hidden_mode: CaptureHiddenMode = CaptureHiddenMode.NULL
    req_to_token_pool: Optional["ReqToTokenPool"] = None
    token_to_kv_pool: Optional["MHATokenToKVPool"] = None
    attn_backend: Optional["FlashInferAttnBackend"] = None
    extra: dict = field(default_factory=dict)


def forward_batch_from_schedule(batch, model_runner) -> ForwardBatch:
    """Build the device-side batch from the scheduler's host lists (``ForwardBatch.init_new``)."""
    device = model_runner.device
    ret = ForwardBatch(
        forward_mode=batch.forward_mode,
        batch_size=len(batch.seq_lens),
        input_ids=torch.tensor(batch.input_ids, dtype=torch.int64).to(device, non_blocking=True),
        req_pool_indices=torch.tensor(batch.req_pool_indices, dtype=torch.int64).to(device, non_blocking=True),
        seq_lens=torch.tensor(batch.seq_lens, dtype=torch.int32).to(device, non_blocking=True),
        out_cache_loc=batch.out_cache_loc,
        seq_lens_sum=sum(batch.seq_lens),
        seq_lens_cpu=torch.tensor(batch.seq_lens, dtype=torch.int32),
        req_to_token_pool=model_runner.req_to_token_pool,
        token_to_kv_pool=model_runner.token_to_kv_pool,
        attn_backend=model_runner.attn_backend,
    )
    if ret.forward_mode.is_extend():
        ret.extend_seq_lens = torch.tensor(batch.extend_seq_lens, dtype=torch.int32).to(device, non_blocking=True)
        ret.extend_prefix_lens = torch.tensor(batch.extend_prefix_lens, dtype=torch.int32).to(device, non_blocking=True)
        ret.extend_seq_lens_cpu = list(batch.extend_seq_lens)
        ret.extend_prefix_lens_cpu = list(batch.extend_prefix_lens)
        ret.extend_num_tokens = sum(batch.extend_seq_lens)
        positions = [torch.arange(p, p + e) for p, e in zip(batch.extend_prefix_lens, batch.extend_seq_lens)]
        ret.positions = torch.cat(positions).to(device, non_blocking=True)
    else:
        ret.positions = (ret.seq_lens - 1).to(torch.int64)
    return ret
