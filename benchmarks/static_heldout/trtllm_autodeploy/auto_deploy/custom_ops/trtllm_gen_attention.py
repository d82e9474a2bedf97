"""Decode-only trtllm-gen attention through FlashInfer (Blackwell); shares the paged cache layout."""

from __future__ import annotations

from typing import Optional

import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache
from torch.fx import Node

from auto_deploy.custom_ops.attention_interface import AttentionRegistry, BufferInitializerDict, SequenceInfo
from auto_deploy.custom_ops.flashinfer_attention import FlashInferAttention

_trtllm_gen_workspace: Optional[torch.Tensor] = None


def get_trtllm_gen_workspace(si: SequenceInfo, num_heads: int) -> torch.Tensor:
    global _trtllm_gen_workspace
    if _trtllm_gen_workspace is None:
        # multi-CTA partial outputs: one fp32 row per (token, head, split), 16 splits at most
        nbytes = si.max_num_tokens * num_heads * 16 * 4 * 2
        _trtllm_gen_workspace = torch.empty(nbytes, dtype=torch.uint8, device=si.device)  # expect: FC105  # ok: FC106
    return _trtllm_gen_workspace


@torch.library.custom_op("auto_deploy::flashinfer_trtllm_gen_decode", mutates_args=())
def flashinfer_trtllm_gen_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    scale: float,
) -> torch.Tensor:
    workspace = _trtllm_gen_workspace
    return trtllm_batch_decode_with_kv_cache(
        query=q,
        kv_cache=kv_cache,
        workspace_buffer=workspace,
        block_tables=block_tables,
        seq_lens=seq_lens,
        max_seq_len=max_seq_len,
        bmm1_scale=scale,
        bmm2_scale=1.0,
    )


@AttentionRegistry.register("flashinfer_trtllm_gen")
class TrtllmGenFlashInferAttention(FlashInferAttention):
    @classmethod
    def get_cached_attention_op(cls):
        return torch.ops.auto_deploy.flashinfer_trtllm_gen_decode

    @classmethod
    def get_global_buffer_initializers(cls, source_attn_node: Node) -> BufferInitializerDict:
        num_heads = source_attn_node.args[0].meta["val"].shape[2]
        return {"workspace_buffer": lambda si: get_trtllm_gen_workspace(si, num_heads)}
