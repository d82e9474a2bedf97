from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Optional

import numpy as np
import torch


class ForwardMode(IntEnum):
    EXTEND = 1
    DECODE = 2
    BLEND = 3


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    page_table_np: Optional[np.ndarray] = None  # host page table rows of this batch
    qo_indptr_cpu: Optional[torch.Tensor] = None
    prompt_lens_np: Optional[np.ndarray] = None
    reused_lens_gpu: Optional[torch.Tensor] = None
    chunk_page_counts_cpu: Optional[torch.Tensor] = None
    cached_k0: Optional[torch.Tensor] = None  # layer-0 keys of the reused chunk tokens, from the store
    is_query_token: Optional[torch.Tensor] = None
    # set by the attention backend
    kv_indptr: Optional[torch.Tensor] = None
    kv_indices: Optional[torch.Tensor] = None
    kv_last_page_len: Optional[torch.Tensor] = None
    decode_wrapper: Any = None

    @classmethod
    def init_new(cls, sched_batch, device: torch.device) -> "ForwardBatch":
        seq_cpu = torch.tensor(sched_batch.seq_lens, dtype=torch.int32).pin_memory()
        fb = cls(
            forward_mode=sched_batch.mode,
            batch_size=len(sched_batch.seq_lens),
            input_ids=torch.tensor(sched_batch.input_ids, dtype=torch.int64).to(device, non_blocking=True),
            positions=torch.tensor(sched_batch.positions, dtype=torch.int64).to(device, non_blocking=True),
            out_cache_loc=torch.tensor(sched_batch.out_cache_loc, dtype=torch.int64).to(device, non_blocking=True),
            seq_lens=seq_cpu.to(device, non_blocking=True),
            seq_lens_cpu=seq_cpu,
            page_table_np=sched_batch.page_table,
        )
        if sched_batch.mode != ForwardMode.DECODE:
            qo = np.zeros(fb.batch_size + 1, dtype=np.int32)
            np.cumsum(sched_batch.extend_lens, out=qo[1:])
            fb.qo_indptr_cpu = torch.from_numpy(qo).pin_memory()
            fb.prompt_lens_np = np.asarray(sched_batch.extend_lens, dtype=np.int32)
        if sched_batch.mode == ForwardMode.BLEND:
            fb.reused_lens_gpu = torch.tensor(sched_batch.reused_lens, dtype=torch.int32, device=device)
            fb.chunk_page_counts_cpu = torch.tensor(sched_batch.chunk_page_counts, dtype=torch.int32).pin_memory()
            fb.cached_k0 = sched_batch.cached_k0
            fb.is_query_token = torch.tensor(sched_batch.is_query_token, dtype=torch.bool).to(device, non_blocking=True)
        return fb
