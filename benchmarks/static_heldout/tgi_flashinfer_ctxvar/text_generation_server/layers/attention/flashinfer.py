"""FlashInfer state of the flash models.

The wrapper serving the current forward is published through a ``ContextVar``: ``FlashCausalLM`` enters one
of the ``use_*_state`` context managers around every forward (they plan the wrapper), and the attention
layers read the wrapper back with ``.get()``.
"""

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Optional

import flashinfer
import torch

prefill_state: ContextVar[flashinfer.BatchPrefillWithRaggedKVCacheWrapper] = ContextVar("prefill_state")
prefill_with_paged_kv_state: ContextVar[flashinfer.BatchPrefillWithPagedKVCacheWrapper] = ContextVar(
    "prefill_with_paged_kv_state"
)
decode_state: ContextVar[flashinfer.BatchDecodeWithPagedKVCacheWrapper] = ContextVar("decode_state")

# One workspace for every paged wrapper of the process; FlashInfer carves each plan out of it.
FLASHINFER_WORKSPACE_BYTES = 128 * 1024 * 1024
_workspace: Optional[torch.Tensor] = None


def get_workspace(device: torch.device) -> torch.Tensor:
    global _workspace
    if _workspace is None:
        _workspace = torch.zeros(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
    return _workspace


def create_prefill_state(*, device: torch.device, max_batch_prefill_tokens: int, num_heads: int):
    # The ragged prefill (nothing cached yet) gets its own float workspace, sized for the longest
    # prefill chunk the router admits: FA2 keeps at most one partial row per token and head.
    ragged_workspace = torch.empty(  # ok: FC105
        max_batch_prefill_tokens * num_heads * 1024, dtype=torch.uint8, device=device
    )
    return flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ragged_workspace, kv_layout="NHD", backend="fa2")


def create_prefill_with_paged_kv_state(*, device: torch.device):
    return flashinfer.BatchPrefillWithPagedKVCacheWrapper(get_workspace(device), kv_layout="NHD")


def create_decode_state(*, device: torch.device, num_heads: int, num_kv_heads: int):
    return flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        get_workspace(device),
        kv_layout="NHD",
        use_tensor_cores=num_heads // num_kv_heads > 4,
    )


def create_decode_state_cuda_graphs(
    *,
    device: torch.device,
    block_tables: torch.Tensor,
    block_tables_ptr: torch.Tensor,
    last_page_len: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
):
    """A decode wrapper for one captured batch size; the graph reads the three buffers by address."""
    last_page_len.fill_(1)  # ok: FC104
    return flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        get_workspace(device),
        kv_layout="NHD",
        use_cuda_graph=True,
        paged_kv_indices_buffer=block_tables,
        paged_kv_indptr_buffer=block_tables_ptr,
        paged_kv_last_page_len_buffer=last_page_len,
        use_tensor_cores=num_heads // num_kv_heads > 4,
    )


@contextmanager
def use_prefill_state(
    *,
    state: flashinfer.BatchPrefillWithRaggedKVCacheWrapper,
    cu_seqlens_cpu: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    q_dtype: torch.dtype,
    window_left: Optional[int],
):
    """Ragged prefill: queries and keys are the same new tokens, so one offset array serves both."""
    token = prefill_state.set(state)
    try:
        state.plan(  # ok: FC102
            qo_indptr=cu_seqlens_cpu,
            kv_indptr=cu_seqlens_cpu,
            num_qo_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim_qk=head_size,
            causal=True,
            window_left=-1 if window_left is None else window_left,
            q_data_type=q_dtype,
        )
        yield
    finally:
        prefill_state.reset(token)


@contextmanager
def use_prefill_with_paged_kv_state(
    *,
    state: flashinfer.BatchPrefillWithPagedKVCacheWrapper,
    block_tables: torch.Tensor,
    cu_seqlens: torch.Tensor,
    kv_lengths: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    page_size: int,
    kv_dtype: torch.dtype,
    q_dtype: torch.dtype,
    window_left: Optional[int],
):
    """Prefill over a cached prefix: ``kv_lengths`` are cached + new tokens of every sequence."""
    device = kv_lengths.device
    paged_indptr = torch.zeros(kv_lengths.shape[0] + 1, dtype=torch.int32, device=device)
    pages = torch.div(kv_lengths + page_size - 1, page_size, rounding_mode="floor")
    torch.cumsum(pages, -1, out=paged_indptr[1:])
    last_page_len = torch.remainder(kv_lengths - 1, page_size) + 1

    token = prefill_with_paged_kv_state.set(state)
    try:
        state.plan(  # expect: FC102
            qo_indptr=cu_seqlens,
            paged_kv_indptr=paged_indptr,
            paged_kv_indices=block_tables,
            paged_kv_last_page_len=last_page_len,
            num_qo_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim_qk=head_size,
            page_size=page_size,
            causal=True,
            window_left=-1 if window_left is None else window_left,
            q_data_type=q_dtype,
            kv_data_type=kv_dtype,
        )
        yield
    finally:
        prefill_with_paged_kv_state.reset(token)


@contextmanager
def use_decode_state(
    *,
    state: flashinfer.BatchDecodeWithPagedKVCacheWrapper,
    kv_lengths: torch.Tensor,
    block_tables: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    page_size: int,
    kv_cache_dtype: torch.dtype,
    q_dtype: torch.dtype,
    window_left: Optional[int],
):
    """Plan the decode wrapper of this step; ``block_tables`` is the ragged page list of the batch."""
    device = kv_lengths.device
    indptr = torch.zeros(kv_lengths.shape[0] + 1, dtype=torch.int32, device=device)
    pages = torch.div(kv_lengths + page_size - 1, page_size, rounding_mode="floor")
    torch.cumsum(pages, -1, out=indptr[1:])
    last_page_len = torch.remainder(kv_lengths - 1, page_size) + 1

    if getattr(state, "_use_cuda_graph", False):  # expect: FC103
        # a graph-mode wrapper copies the list into the table its graph was captured with
        indices = block_tables
    else:
        # the eager wrapper only gets the pages in use
        indices = block_tables[: int(indptr[-1])]  # expect: FC101

    token = decode_state.set(state)
    try:
        state.begin_forward(  # expect: FC102
            indptr=indptr,
            indices=indices,
            last_page_len=last_page_len,
            num_qo_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_size,
            page_size=page_size,
            data_type=kv_cache_dtype,
            q_data_type=q_dtype,
            window_left=-1 if window_left is None else window_left,
        )
        yield
    finally:
        state.end_forward()
        decode_state.reset(token)
