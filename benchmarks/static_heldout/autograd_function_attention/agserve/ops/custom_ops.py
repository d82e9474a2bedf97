"""Ops registered with torch.library so the model traces cleanly under torch.compile.

A custom op only takes tensors and scalars: the FlashInfer MLA wrapper it runs comes from the
module-level registry, the trtllm-gen / XQA workspaces come in as tensors.
"""

import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache, xqa_batch_decode_with_kv_cache

from .registry import get_wrapper


@torch.library.custom_op("agserve::store_kv", mutates_args=("k_cache", "v_cache"), device_types="cuda")
def store_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, loc: torch.Tensor
) -> None:
    # caches are [num_pages, page_size, num_kv_heads, head_dim]; loc is a flat slot index
    k_cache.view(-1, *k_cache.shape[2:])[loc] = k
    v_cache.view(-1, *v_cache.shape[2:])[loc] = v


@store_kv.register_fake
def _store_kv_fake(k_cache, v_cache, k, v, loc):
    return None


@torch.library.custom_op("agserve::trtllm_paged_decode", mutates_args=(), device_types="cuda")
def trtllm_paged_decode(
    query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, workspace: torch.Tensor,
    block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
) -> torch.Tensor:
    assert block_tables.dim() == 2, "block_tables must be [batch, pages_per_request]"  # expect: FC109
    max_seq_len = int(seq_lens.max())  # expect: FC101
    return trtllm_batch_decode_with_kv_cache(
        query, (k_cache, v_cache), workspace, block_tables, seq_lens, max_seq_len, bmm1_scale=scale, bmm2_scale=1.0
    )


@trtllm_paged_decode.register_fake
def _trtllm_paged_decode_fake(query, k_cache, v_cache, workspace, block_tables, seq_lens, scale):
    assert query.dim() == 3, "query must be [tokens, heads, head_dim]"  # ok: FC109
    return torch.empty_like(query)


@torch.library.custom_op("agserve::xqa_paged_decode", mutates_args=(), device_types="cuda")
def xqa_paged_decode(
    query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, workspace: torch.Tensor,
    block_tables: torch.Tensor, seq_lens: torch.Tensor, max_seq_len: int, scale: float,
) -> torch.Tensor:
    # max_seq_len is the engine's context limit, known on the host
    return xqa_batch_decode_with_kv_cache(
        query, (k_cache, v_cache), workspace, block_tables, seq_lens, max_seq_len, bmm1_scale=scale, bmm2_scale=1.0
    )


@torch.library.register_fake("agserve::xqa_paged_decode")
def _xqa_paged_decode_fake(query, k_cache, v_cache, workspace, block_tables, seq_lens, max_seq_len, scale):
    return torch.empty_like(query)


@torch.library.custom_op("agserve::mla_attention", mutates_args=("out",), device_types="cuda")
def mla_attention(
    q_nope: torch.Tensor, q_pe: torch.Tensor, ckv_cache: torch.Tensor, kpe_cache: torch.Tensor, out: torch.Tensor
) -> None:
    wrapper = get_wrapper("mla")
    wrapper.run(q_nope, q_pe, ckv_cache, kpe_cache, out=out)  # expect: FC108


@mla_attention.register_fake
def _mla_attention_fake(q_nope, q_pe, ckv_cache, kpe_cache, out):
    return None
