"""Per-step inputs of the decoder: one new token per request, with host mirrors of every length."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from srt.layers.attention.flashinfer_encdec import FlashInferEncDecBackend


@dataclass
class EncDecForwardBatch:
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    req_pool_indices_cpu: torch.Tensor
    encoder_lens: torch.Tensor
    encoder_lens_cpu: torch.Tensor
    out_cache_loc: torch.Tensor
    token_to_kv_pool: Any
    attn_backend: "FlashInferEncDecBackend"

    @classmethod
    def from_schedule(cls, batch, runner) -> "EncDecForwardBatch":
        dev = runner.device
        seq_lens_cpu = torch.tensor([r.decoder_len for r in batch.reqs], dtype=torch.int32)
        enc_cpu = torch.tensor([r.encoder_len for r in batch.reqs], dtype=torch.int32)
        return cls(
            batch_size=len(batch.reqs),
            input_ids=torch.tensor(batch.next_token_ids, dtype=torch.int64).to(dev, non_blocking=True),
            positions=(seq_lens_cpu - 1).to(dev, non_blocking=True),
            seq_lens=seq_lens_cpu.to(dev, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu,
            req_pool_indices_cpu=torch.tensor([r.req_pool_idx for r in batch.reqs], dtype=torch.int32),
            encoder_lens=enc_cpu.to(dev, non_blocking=True),
            encoder_lens_cpu=enc_cpu,
            out_cache_loc=batch.out_cache_loc,
            token_to_kv_pool=runner.token_to_kv_pool,
            attn_backend=runner.attn_backend,
        )
