"""Attention closures. Each factory captures its wrapper(s) and returns the functions a step calls.

An ``attend(q, k, v, kv_cache)`` closure is what a model layer calls; a ``step(batch)`` closure plans the
wrappers for a batch and runs the model with the matching ``attend`` closures.
"""

from __future__ import annotations

from typing import Callable

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from .batch import ForwardBatch
from .config import EngineConfig
from .workspaces import trtllm_scratch

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def make_decode_attend(decode_wrapper: BatchDecodeWithPagedKVCacheWrapper) -> Attend:
    # used with the eager wrapper past the largest bucket and with each bucket's graph-mode wrapper
    def attend(q, k, v, kv_cache):
        return decode_wrapper.run(q, kv_cache)  # ok: FC108

    return attend


def make_window_attend(
    window_wrapper: BatchDecodeWithPagedKVCacheWrapper,
    kv_layout: str,
    layout_of=lambda w: w._kv_layout,  # expect: FC103
) -> Attend:
    if layout_of(window_wrapper) != kv_layout:
        raise ValueError(f"window wrapper layout does not match the cache layout {kv_layout}")

    def attend(q, k, v, kv_cache):
        return window_wrapper.run(q, kv_cache)  # expect: FC108

    return attend


def make_eager_decode_step(
    cfg: EngineConfig,
    model: torch.nn.Module,
    kv_caches: list[torch.Tensor],
    decode_wrapper: BatchDecodeWithPagedKVCacheWrapper,
    window_wrapper: BatchDecodeWithPagedKVCacheWrapper,
    nnz_of=lambda b: int(b.kv_indptr_cpu[-1]),  # ok: FC101
) -> Callable[[ForwardBatch], torch.Tensor]:
    """Decode for batches larger than the largest captured bucket."""
    attend = make_decode_attend(decode_wrapper)
    attend_window = make_window_attend(window_wrapper, cfg.kv_layout)
    dims = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)

    def step(batch: ForwardBatch) -> torch.Tensor:
        nnz = nnz_of(batch)
        indices = batch.kv_indices[:nnz]
        decode_wrapper.plan(  # expect: FC102
            batch.kv_indptr,
            indices,
            batch.kv_last_page_len_cpu,
            *dims,
            q_data_type=cfg.dtype,
            kv_data_type=cfg.dtype,
        )
        window_wrapper.plan(  # ok: FC102
            batch.kv_indptr_cpu,
            indices,
            batch.kv_last_page_len_cpu,
            *dims,
            window_left=cfg.window_left,
            q_data_type=cfg.dtype,
            kv_data_type=cfg.dtype,
        )
        return model(batch.input_ids, batch.positions, batch.out_cache_loc, kv_caches, attend, attend_window)

    return step


def make_extend_fns(
    cfg: EngineConfig,
    ragged,
    paged,
    tokens_of=lambda b: int(b.extend_lens.sum()),  # expect: FC101
) -> tuple[Callable[[ForwardBatch], None], Attend]:
    """Returns ``(prepare, attend)`` for prompt extension; ``prepare`` picks ragged or paged for the batch."""
    use_ragged = True
    dims = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim)

    def prepare(batch: ForwardBatch) -> None:
        nonlocal use_ragged
        num_tokens = tokens_of(batch)
        if num_tokens > cfg.max_num_tokens:
            raise ValueError(f"extend of {num_tokens} tokens exceeds max_num_tokens={cfg.max_num_tokens}")
        use_ragged = not batch.has_prefix
        if use_ragged:
            ragged.plan(  # expect: FC102
                batch.qo_indptr,
                batch.qo_indptr_cpu,
                *dims,
                causal=True,
                q_data_type=cfg.dtype,
            )
        else:
            paged.plan(  # ok: FC102
                batch.qo_indptr_cpu,
                batch.kv_indptr_cpu,
                batch.kv_indices,
                batch.kv_last_page_len_cpu,
                *dims,
                cfg.page_size,
                causal=True,
                q_data_type=cfg.dtype,
            )

    def attend(q, k, v, kv_cache):
        if use_ragged:
            return ragged.run(q, k, v)  # ok: FC108
        return paged.run(q, kv_cache)  # ok: FC108

    return prepare, attend


def make_extend_step(
    model: torch.nn.Module, kv_caches: list[torch.Tensor], prepare: Callable[[ForwardBatch], None], attend: Attend
) -> Callable[[ForwardBatch], torch.Tensor]:
    def step(batch: ForwardBatch) -> torch.Tensor:
        prepare(batch)
        logits = model(batch.input_ids, batch.positions, batch.out_cache_loc, kv_caches, attend, attend)
        return logits[batch.qo_indptr[1:] - 1]

    return step


def make_trtllm_decode_step(
    cfg: EngineConfig, model: torch.nn.Module, kv_caches: list[torch.Tensor], device: torch.device
) -> Callable[[ForwardBatch], torch.Tensor]:
    """Decode past the largest bucket through the raw trtllm-gen kernel (HND cache, block tables)."""
    ws = trtllm_scratch(device.index or 0, cfg.trtllm_workspace_bytes())
    scale = cfg.head_dim**-0.5
    current: ForwardBatch | None = None

    def attend(q, k, v, kv_cache):
        return trtllm_batch_decode_with_kv_cache(
            q, kv_cache, ws, current.block_tables, current.seq_lens, cfg.max_seq_len, scale, 1.0
        )

    def attend_window(q, k, v, kv_cache):
        return trtllm_batch_decode_with_kv_cache(
            q,
            kv_cache,
            ws,
            current.block_tables,
            current.seq_lens,
            cfg.max_seq_len,
            scale,
            1.0,
            window_left=cfg.window_left,
        )

    def step(batch: ForwardBatch) -> torch.Tensor:
        nonlocal current
        current = batch
        try:
            return model(batch.input_ids, batch.positions, batch.out_cache_loc, kv_caches, attend, attend_window)
        finally:
            current = None

    return step
