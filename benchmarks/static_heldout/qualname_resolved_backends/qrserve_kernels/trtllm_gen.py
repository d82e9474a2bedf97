"""trtllm-gen decode and context attention (Blackwell).

The platform table names this module ("qrserve_kernels.trtllm_gen") as the decode kernel of ``cuda-sm100`` in graph
mode; ``FlashInferImpl`` imports it with ``importlib.import_module`` and calls ``decode``/``context``. The kernels
need no ``plan()``: they read the block table and the sequence lengths directly, so the decode is graph-safe.
"""

from __future__ import annotations

import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

KERNEL_NAME = "trtllm-gen"

_DECODE_WORKSPACES: dict[tuple[str, int], torch.Tensor] = {}
_CONTEXT_WORKSPACES: dict[tuple[str, int], torch.Tensor] = {}


def workspace_bytes(max_num_seqs: int, num_qo_heads: int, head_dim: int) -> int:
    """Multi-CTA partial outputs (fp32) plus one semaphore per CTA, for the largest decode batch."""
    return max_num_seqs * num_qo_heads * head_dim * 4 * 16 + max_num_seqs * num_qo_heads * 64


def get_workspace(device: torch.device, nbytes: int, zeroed: bool = False) -> torch.Tensor:
    key = (str(device), nbytes)
    ws = _DECODE_WORKSPACES.get(key)
    if ws is None:
        ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
        if zeroed:
            ws.zero_()
        _DECODE_WORKSPACES[key] = ws
    return ws


def context_workspace(device: torch.device, nbytes: int) -> torch.Tensor:
    key = (str(device), nbytes)
    ws = _CONTEXT_WORKSPACES.get(key)
    if ws is None:
        ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
        ws.zero_()
        _CONTEXT_WORKSPACES[key] = ws
    return ws


def decode(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    max_num_seqs: int,
    scale: float,
    window_left: int = -1,
) -> torch.Tensor:
    assert query.dim() == 3, "query must be [num_tokens, num_heads, head_dim]"  # expect: FC109
    if seq_lens.shape[0] != block_tables.shape[0]:
        raise ValueError(f"seq_lens {seq_lens} has {seq_lens.shape[0]} rows, block_tables {block_tables.shape[0]}")  # ok: FC101
    max_seq_len = int(seq_lens.max())  # expect: FC101
    ws = get_workspace(query.device, workspace_bytes(max_num_seqs, query.shape[1], query.shape[2]))
    return trtllm_batch_decode_with_kv_cache(
        query=query,
        kv_cache=kv_cache,
        workspace_buffer=ws,
        block_tables=block_tables,
        seq_lens=seq_lens,
        max_seq_len=max_seq_len,
        bmm1_scale=scale,
        bmm2_scale=1.0,
        window_left=window_left,
    )


def context(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_kv: torch.Tensor,
    *,
    max_q_len: int,
    max_kv_len: int,
    batch_size: int,
    scale: float,
    workspace_nbytes: int,
) -> torch.Tensor:
    ws = context_workspace(query.device, workspace_nbytes)
    return trtllm_batch_context_with_kv_cache(
        query=query,
        kv_cache=kv_cache,
        workspace_buffer=ws,
        block_tables=block_tables,
        seq_lens=seq_lens,
        max_q_len=max_q_len,
        max_kv_len=max_kv_len,
        bmm1_scale=scale,
        bmm2_scale=1.0,
        batch_size=batch_size,
        cum_seq_lens_q=cu_seqlens_q,
        cum_seq_lens_kv=cu_seqlens_kv,
    )
