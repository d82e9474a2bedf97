"""Per-step attention metadata shared by both layer groups, and the local layers' virtual batches.

A local (chunked) layer lets a token attend only to the tokens of its own ``attn_chunk_size`` chunk. Each
request is therefore split into "virtual batches", one per chunk its new query tokens touch: the virtual
batch's query is the part of the request's query inside the chunk, its KV is the chunk up to the last query
token, and its block table is the window of the request's blocks that covers the chunk. Global layers see the
requests as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import numpy as np
import torch

# FlashInfer wrapper fields that a captured decode graph reads by address (debug builds compare them at replay)
GRAPH_BUFFER_FIELDS = ("_paged_kv_indptr_buf", "_paged_kv_indices_buf", "_paged_kv_last_page_len_buf")


@dataclass
class CommonAttentionMetadata:
    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    block_table_tensor: torch.Tensor
    block_table_cpu: torch.Tensor
    slot_mapping: torch.Tensor
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int


@dataclass
class VirtualBatches:
    cu_seqlens_q_np: np.ndarray
    seqlens_k_np: np.ndarray
    block_table: torch.Tensor  # [num_virtual, pages_per_chunk] block ids, on the block table's device
    num_virtual: int
    max_query_len: int


def split_decodes_and_prefills(common: CommonAttentionMetadata) -> Tuple[int, int, int]:
    """Requests are ordered decodes first; returns (num_decodes, num_prefills, num_decode_tokens)."""
    qsl = common.query_start_loc_cpu
    query_lens = qsl[1:] - qsl[:-1]
    is_prefill = query_lens > 1
    if not torch.any(is_prefill):  # ok: FC101
        return common.num_reqs, 0, common.num_actual_tokens
    first_prefill = int(torch.argmax(is_prefill.int()))
    return first_prefill, common.num_reqs - first_prefill, int(qsl[first_prefill])


def make_local_attention_virtual_batches(
    attn_chunk_size: int, common: CommonAttentionMetadata, block_size: int
) -> VirtualBatches:
    assert attn_chunk_size % block_size == 0, "attention chunk must be a whole number of blocks"  # expect: FC109
    q_seqlens = np.diff(common.query_start_loc_cpu.numpy())  # ok: FC101
    seq_lens_np = common.seq_lens.cpu().numpy()  # expect: FC101
    q_start = seq_lens_np - q_seqlens

    first_chunk = q_start // attn_chunk_size
    last_chunk = (seq_lens_np - 1) // attn_chunk_size
    per_req = last_chunk - first_chunk + 1
    req_idx = np.repeat(np.arange(len(seq_lens_np)), per_req)
    starts = np.repeat(np.cumsum(per_req) - per_req, per_req)
    chunk_idx = first_chunk[req_idx] + (np.arange(len(req_idx)) - starts)

    chunk_lo = chunk_idx * attn_chunk_size
    chunk_hi = np.minimum(chunk_lo + attn_chunk_size, seq_lens_np[req_idx])
    seqlens_q = (chunk_hi - np.maximum(chunk_lo, q_start[req_idx])).astype(np.int32)
    seqlens_k = (chunk_hi - chunk_lo).astype(np.int32)
    cu_seqlens_q = np.zeros(len(seqlens_q) + 1, dtype=np.int32)
    np.cumsum(seqlens_q, out=cu_seqlens_q[1:])

    pages_per_chunk = attn_chunk_size // block_size
    width = common.block_table_tensor.shape[1]
    cols = (chunk_lo // block_size)[:, None] + np.arange(pages_per_chunk)[None, :]
    cols = np.minimum(cols, width - 1)
    device = common.block_table_tensor.device
    rows_t = torch.from_numpy(req_idx).to(device, non_blocking=True)
    cols_t = torch.from_numpy(cols).to(device, non_blocking=True)
    block_table = common.block_table_tensor[rows_t[:, None], cols_t]
    return VirtualBatches(
        cu_seqlens_q_np=cu_seqlens_q,
        seqlens_k_np=seqlens_k,
        block_table=block_table,
        num_virtual=len(seqlens_q),
        max_query_len=int(seqlens_q.max()) if len(seqlens_q) else 0,  # ok: FC101
    )
