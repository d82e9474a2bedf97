from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import torch

from ..multimodal import MultimodalInputs

if TYPE_CHECKING:
    from ..layers import FlashInferVLMBackend


class ForwardMode(enum.Enum):
    EXTEND = enum.auto()
    DECODE = enum.auto()
    MIXED = enum.auto()

    def is_decode(self) -> bool:
        return self is ForwardMode.DECODE

    def is_extend(self) -> bool:
        return self in (ForwardMode.EXTEND, ForwardMode.MIXED)


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    out_cache_loc: torch.Tensor
    attn_backend: "FlashInferVLMBackend"
    token_to_kv_pool: object
    extend_seq_lens: Optional[torch.Tensor] = None
    extend_prefix_lens: Optional[torch.Tensor] = None
    extend_seq_lens_cpu: list[int] = field(default_factory=list)
    extend_prefix_lens_cpu: list[int] = field(default_factory=list)
    mm_inputs: list[Optional[MultimodalInputs]] = field(default_factory=list)
    encoder_indptr_cpu: Optional[torch.Tensor] = None
    encoder_indices: Optional[torch.Tensor] = None
    mrope_positions: Optional[torch.Tensor] = None

    @classmethod
    def init_new(cls, batch, model_runner) -> "ForwardBatch":
        dev = model_runner.device
        to_dev = lambda xs, dt=torch.int32: torch.tensor(xs, dtype=dt).to(dev, non_blocking=True)  # noqa: E731
        fb = cls(
            batch.forward_mode, len(batch.reqs), to_dev(batch.input_ids, torch.int64), to_dev(batch.req_pool_indices),
            to_dev(batch.seq_lens), torch.tensor(batch.seq_lens, dtype=torch.int32), to_dev(batch.out_cache_loc, torch.int64),
            model_runner.attn_backend, model_runner.token_to_kv_pool, mm_inputs=[r.mm_inputs for r in batch.reqs],
        )
        if fb.forward_mode.is_extend():
            fb.extend_seq_lens, fb.extend_prefix_lens = to_dev(batch.extend_lens), to_dev(batch.prefix_lens)
            fb.extend_seq_lens_cpu, fb.extend_prefix_lens_cpu = list(batch.extend_lens), list(batch.prefix_lens)
        return fb
