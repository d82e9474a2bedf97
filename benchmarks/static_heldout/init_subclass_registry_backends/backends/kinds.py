"""Enum views of the registry: backend classes by kind, and the decode used above the largest graph bucket."""

from __future__ import annotations

import enum

import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from regattn import AttentionBackend, ForwardBatch
from backends.flashinfer_backend import FlashInferBackend
from backends.sliding_window import SlidingWindowBackend
from backends.trtllm_gen import TrtllmGenBackend


def fa2_overflow(backend: FlashInferBackend, q: torch.Tensor, kv_cache: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
    return backend.decode_wrapper.run(q, kv_cache)


def trtllm_overflow(backend: TrtllmGenBackend, q: torch.Tensor, kv_cache: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
    scale = backend._sm_scale  # ok: FC103
    return trtllm_batch_decode_with_kv_cache(
        query=q, kv_cache=kv_cache, workspace_buffer=backend.overflow_ws, block_tables=backend.block_tables,
        seq_lens=batch.seq_lens, max_seq_len=backend.overflow_max_len, bmm1_scale=scale, bmm2_scale=1.0,
    )


class Kind(enum.Enum):
    FLASHINFER = FlashInferBackend
    SWA = SlidingWindowBackend
    TRTLLM = TrtllmGenBackend


class OverflowDecode(enum.Enum):
    FA2 = enum.member(fa2_overflow)
    TRTLLM = enum.member(trtllm_overflow)


assert all(k.value in AttentionBackend._registry.values() for k in Kind), "every kind must be a registered backend"  # ok: FC109
