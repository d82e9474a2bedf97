"""What one step runs on: the scheduler's host batch and the runner's ForwardBatch.

``ForwardBatch`` carries device tensors for the model and the sampler, and host
mirrors (pinned tensors, numpy views) for everything the CPU needs to read:
FlashInfer's planner, bucket selection, statistics.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np
import torch

from .config import EngineConfig


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE


@dataclass
class ScheduledBatch:
    """Host-only description of a step, as the scheduler process sends it."""

    forward_mode: ForwardMode
    req_ids: Tuple[str, ...]
    input_ids: List[int]
    positions: List[int]
    seq_lens: List[int]
    extend_lens: List[int]
    page_table_rows: np.ndarray  # [bs, pages of the longest request]
    out_cache_loc: List[int]
    temperatures: List[float]
    top_k: List[int]
    output_lens: List[int]
    min_new_tokens: List[int]
    freed_pages: Optional[np.ndarray] = None  # pages released since the previous step


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    req_ids: Tuple[str, ...]
    # device
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    page_table: torch.Tensor
    out_cache_loc: torch.Tensor
    temperatures: torch.Tensor
    top_k: torch.Tensor
    output_lens: torch.Tensor
    min_new_tokens: torch.Tensor
    stop_token_ids: torch.Tensor
    qo_indptr: Optional[torch.Tensor] = None
    last_token_index: Optional[torch.Tensor] = None
    # host mirrors
    seq_lens_cpu: Optional[torch.Tensor] = None
    qo_indptr_cpu: Optional[torch.Tensor] = None
    top_k_cpu: Optional[torch.Tensor] = None
    page_table_np: Optional[np.ndarray] = None
    num_extend_tokens: int = 0
    # set while a decode graph is captured for this bucket
    graph_bs: Optional[int] = None


class HostStaging:
    """Pinned staging buffers reused every step; the device tensors are copied from them."""

    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        self.device = device
        mb, mt = cfg.max_batch_size, cfg.max_num_tokens
        self.input_ids = torch.zeros(mt, dtype=torch.int64, pin_memory=True)
        self.positions = torch.zeros(mt, dtype=torch.int64, pin_memory=True)
        self.out_cache_loc = torch.zeros(mt, dtype=torch.int64, pin_memory=True)
        self.seq_lens = torch.zeros(mb, dtype=torch.int32, pin_memory=True)
        self.qo_indptr = torch.zeros(mb + 1, dtype=torch.int32, pin_memory=True)
        self.temperatures = torch.zeros(mb, dtype=torch.float32, pin_memory=True)
        self.top_k = torch.zeros(mb, dtype=torch.int32, pin_memory=True)
        self.output_lens = torch.zeros(mb, dtype=torch.int32, pin_memory=True)
        self.min_new_tokens = torch.zeros(mb, dtype=torch.int32, pin_memory=True)
        self.page_table = torch.zeros(mb, cfg.max_pages_per_seq(), dtype=torch.int32, pin_memory=True)

    def build(self, sched: ScheduledBatch, stop_token_ids: torch.Tensor) -> ForwardBatch:
        bs = len(sched.req_ids)
        nt = len(sched.input_ids)
        dev = self.device
        self.input_ids.numpy()[:nt] = sched.input_ids
        self.positions.numpy()[:nt] = sched.positions
        self.out_cache_loc.numpy()[:nt] = sched.out_cache_loc
        self.seq_lens.numpy()[:bs] = sched.seq_lens
        self.temperatures.numpy()[:bs] = sched.temperatures
        self.top_k.numpy()[:bs] = sched.top_k
        self.output_lens.numpy()[:bs] = sched.output_lens
        self.min_new_tokens.numpy()[:bs] = sched.min_new_tokens
        page_table_np = self.page_table.numpy()[:bs]
        page_table_np[:, : sched.page_table_rows.shape[1]] = sched.page_table_rows

        qo_indptr = qo_indptr_cpu = last_token_index = None
        extend = not sched.forward_mode.is_decode()
        if extend:
            qo_np = self.qo_indptr.numpy()
            qo_np[0] = 0
            np.cumsum(sched.extend_lens, out=qo_np[1 : bs + 1])
            qo_indptr_cpu = self.qo_indptr[: bs + 1]
            qo_indptr = qo_indptr_cpu.to(dev, non_blocking=True)
            last_token_index = (qo_indptr[1:] - 1).long()

        seq_lens_cpu = self.seq_lens[:bs]
        return ForwardBatch(
            forward_mode=sched.forward_mode,
            batch_size=bs,
            req_ids=tuple(sched.req_ids),
            input_ids=self.input_ids[:nt].to(dev, non_blocking=True),
            positions=self.positions[:nt].to(dev, non_blocking=True),
            seq_lens=seq_lens_cpu.to(dev, non_blocking=True),
            page_table=self.page_table[:bs].to(dev, non_blocking=True),
            out_cache_loc=self.out_cache_loc[:nt].to(dev, non_blocking=True),
            temperatures=self.temperatures[:bs].to(dev, non_blocking=True),
            top_k=self.top_k[:bs].to(dev, non_blocking=True),
            output_lens=self.output_lens[:bs].to(dev, non_blocking=True),
            min_new_tokens=self.min_new_tokens[:bs].to(dev, non_blocking=True),
            stop_token_ids=stop_token_ids,
            qo_indptr=qo_indptr,
            last_token_index=last_token_index,
            seq_lens_cpu=seq_lens_cpu,
            qo_indptr_cpu=qo_indptr_cpu,
            top_k_cpu=self.top_k[:bs],
            page_table_np=page_table_np,
            num_extend_tokens=nt if extend else 0,
        )
