"""Per-step metadata: device tensors the kernels read beside the host mirrors the planner reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper


@dataclass
class StepMetadata:
    batch_size: int
    is_prefill: bool
    num_tokens: int
    max_seq_len: int
    seq_lens: torch.Tensor  # [bs] int32, device
    seq_lens_cpu: torch.Tensor  # [bs] int32, pinned
    qo_indptr: torch.Tensor  # [bs + 1] int32, device (rope offsets, logits gather)
    qo_indptr_cpu: torch.Tensor  # [bs + 1] int32, host
    block_table: torch.Tensor  # [bs, max_pages] int32, device (trtllm-gen)
    page_table_np: np.ndarray  # [bs, max_pages] int32, host
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    # chosen by the backend: an eager wrapper per step, a bucket's graph wrapper on capture and replay
    decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None


def _positions_and_slots(lens_np: np.ndarray, q_lens_np: np.ndarray, page_table_np: np.ndarray, page_size: int):
    starts = lens_np - q_lens_np
    positions = np.concatenate([np.arange(s, s + q, dtype=np.int64) for s, q in zip(starts, q_lens_np)])
    rows = np.repeat(np.arange(lens_np.shape[0]), q_lens_np)
    slots = page_table_np[rows, positions // page_size].astype(np.int64) * page_size + positions % page_size
    return positions, slots


def make_step_metadata(
    lens_np: np.ndarray,
    q_lens_np: np.ndarray,
    page_table_np: np.ndarray,
    token_ids_np: np.ndarray,
    page_size: int,
    device: torch.device,
    is_prefill: bool,
) -> StepMetadata:
    """Build one step's metadata on the host and start its device copies (all non-blocking from pinned memory)."""
    bs = lens_np.shape[0]
    qo_indptr_np = np.zeros(bs + 1, dtype=np.int32)
    np.cumsum(q_lens_np, out=qo_indptr_np[1:])
    positions_np, slots_np = _positions_and_slots(lens_np, q_lens_np, page_table_np, page_size)

    seq_lens_cpu = torch.from_numpy(lens_np.astype(np.int32)).pin_memory()
    qo_indptr_cpu = torch.from_numpy(qo_indptr_np)
    table_cpu = torch.from_numpy(np.ascontiguousarray(page_table_np, dtype=np.int32)).pin_memory()

    return StepMetadata(
        batch_size=bs,
        is_prefill=is_prefill,
        num_tokens=int(qo_indptr_np[-1]),
        max_seq_len=int(seq_lens_cpu.max()),  # ok: FC101
        seq_lens=seq_lens_cpu.to(device, non_blocking=True),
        seq_lens_cpu=seq_lens_cpu,
        qo_indptr=qo_indptr_cpu.pin_memory().to(device, non_blocking=True),
        qo_indptr_cpu=qo_indptr_cpu,
        block_table=table_cpu.to(device, non_blocking=True),
        page_table_np=page_table_np,
        input_ids=torch.from_numpy(token_ids_np.astype(np.int64)).pin_memory().to(device, non_blocking=True),
        positions=torch.from_numpy(positions_np).pin_memory().to(device, non_blocking=True),
        out_cache_loc=torch.from_numpy(slots_np).pin_memory().to(device, non_blocking=True),
    )
