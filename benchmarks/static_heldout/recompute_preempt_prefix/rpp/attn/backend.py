from __future__ import annotations

from typing import Optional

import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from rpp.attn.metadata import FlashInferMetadata


class FlashInferImpl:
    """Attention of one layer: writes the new K/V into the paged cache through the
    engine's cache extension, then runs the wrappers the builder planned."""

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 kv_cache_dtype: str, layer_idx: int):
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.layer_idx = layer_idx
        self._k_scale = torch.ones((), dtype=torch.float32)
        self._v_scale = torch.ones((), dtype=torch.float32)
        self._k_scale_float = 1.0
        self._v_scale_float = 1.0
        self._decode_uses_tc: Optional[bool] = None

    def _write_kv(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                  slot_mapping: torch.Tensor) -> None:
        torch.ops._C_cache_ops.reshape_and_cache_flash(
            key, value, kv_cache[:, 0], kv_cache[:, 1], slot_mapping, self.kv_cache_dtype,
            self._k_scale, self._v_scale)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: FlashInferMetadata, output: torch.Tensor) -> torch.Tensor:
        n = attn_metadata.num_actual_tokens
        self._write_kv(key[:n], value[:n], kv_cache, attn_metadata.slot_mapping)
        nd = attn_metadata.num_decode_tokens
        if attn_metadata.prefill_wrapper is not None:
            q = query[nd:n]
            if attn_metadata.use_ragged_prefill:
                output[nd:n] = attn_metadata.prefill_wrapper.run(q, key[nd:n], value[nd:n])
            else:
                output[nd:n] = attn_metadata.prefill_wrapper.run(q, kv_cache, k_scale=self._k_scale_float,
                                                                  v_scale=self._v_scale_float)
        if nd > 0:
            self._decode(query[:nd], kv_cache, attn_metadata, output[:nd])
        return output

    def forward_decode(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                       attn_metadata: FlashInferMetadata, output: torch.Tensor) -> torch.Tensor:
        """Pure decode batch: the path recorded into the decode graphs."""
        self._write_kv(key, value, kv_cache, attn_metadata.slot_mapping)
        self._decode(query, kv_cache, attn_metadata, output)
        return output

    def _decode(self, q: torch.Tensor, kv_cache: torch.Tensor, attn_metadata: FlashInferMetadata,
                out: torch.Tensor) -> None:
        if attn_metadata.trtllm_workspace is not None:
            out.copy_(trtllm_batch_decode_with_kv_cache(
                query=q,
                kv_cache=kv_cache,
                workspace_buffer=attn_metadata.trtllm_workspace,
                block_tables=attn_metadata.block_table,
                seq_lens=attn_metadata.seq_lens,
                max_seq_len=attn_metadata.max_seq_len,
                bmm1_scale=self._k_scale_float * self.scale,
                bmm2_scale=self._v_scale_float,
            ))
        elif attn_metadata.fp8_decode_wrapper is not None:
            out.copy_(attn_metadata.fp8_decode_wrapper.run(q, kv_cache, k_scale=self._k_scale_float,  # expect: FC108
                                                           v_scale=self._v_scale_float))
        else:
            w = attn_metadata.decode_wrapper
            if self._decode_uses_tc is None:
                self._decode_uses_tc = bool(getattr(w, "_use_tensor_cores", False))  # expect: FC103
            w.run(q, kv_cache, out=out)  # ok: FC108
