"""Per-step model inputs and the step context the model reads through a ContextVar."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, List, Optional

import numpy as np
import torch

if TYPE_CHECKING:
    from lmdeploy.pytorch.backends.flashinfer_meta import FlashInferMetaBuilder


@dataclass
class ModelInputs:
    input_ids: torch.Tensor
    seq_length: torch.Tensor
    history_lengths: torch.Tensor
    block_offsets_np: np.ndarray
    seq_length_np: np.ndarray
    history_lengths_np: np.ndarray
    is_decoding: bool
    max_q_seqlen: int

    @classmethod
    def from_host(cls, input_ids: np.ndarray, seq_length: np.ndarray, history: np.ndarray, block_offsets: np.ndarray,
                  is_decoding: bool, device: torch.device) -> "ModelInputs":
        return cls(
            input_ids=torch.from_numpy(input_ids)[None].to(device, non_blocking=True),
            seq_length=torch.from_numpy(seq_length).to(device, non_blocking=True),
            history_lengths=torch.from_numpy(history).to(device, non_blocking=True),
            block_offsets_np=block_offsets, seq_length_np=seq_length, history_lengths_np=history,
            is_decoding=is_decoding, max_q_seqlen=int(seq_length.max()),
        )


@dataclass
class StepContext:
    input_ids: torch.Tensor
    q_seqlens: torch.Tensor
    kv_seqlens: torch.Tensor
    q_start_loc: torch.Tensor
    kv_caches: List[torch.Tensor]
    is_decoding: bool
    max_q_seqlen: int
    max_kv_seqlen: int
    block_offsets_np: Optional[np.ndarray] = None
    kv_seqlens_np: Optional[np.ndarray] = None
    attn_metadata: Any = None

    @classmethod
    def new(cls, inputs: ModelInputs, kv_caches: List[torch.Tensor], meta_builder: "FlashInferMetaBuilder") -> "StepContext":
        assert len(kv_caches) > 0, "no KV cache allocated"  # expect: FC109
        q_seqlens = inputs.seq_length
        kv_seqlens = q_seqlens + inputs.history_lengths
        q_start_loc = q_seqlens.cumsum(0) - q_seqlens
        max_kv_seqlen = int(kv_seqlens.max())  # expect: FC101
        ret = cls(
            input_ids=inputs.input_ids, q_seqlens=q_seqlens, kv_seqlens=kv_seqlens, q_start_loc=q_start_loc, kv_caches=kv_caches,
            is_decoding=inputs.is_decoding, max_q_seqlen=inputs.max_q_seqlen, max_kv_seqlen=max_kv_seqlen,
        )
        ret.block_offsets_np = inputs.block_offsets_np
        ret.kv_seqlens_np = inputs.seq_length_np + inputs.history_lengths_np
        ret.attn_metadata = meta_builder.build(ret)
        return ret


_STEP_CTX: ContextVar[StepContext] = ContextVar("lmdeploy_step_ctx")


def set_step_context(ctx: StepContext) -> None:
    _STEP_CTX.set(ctx)


def get_step_context() -> StepContext:
    return _STEP_CTX.get()
