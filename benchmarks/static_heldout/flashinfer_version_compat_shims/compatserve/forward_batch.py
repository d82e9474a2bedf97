"""Per-step batch: device tensors for the kernels, pinned/numpy mirrors for the planners."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2
    IDLE = 3

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_extend(self) -> bool:
        return self == ForwardMode.EXTEND


@dataclass
class Req:
    rid: str
    req_pool_idx: int
    seq_len: int
    extend_len: int
    last_token: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    extend_ids: List[int] = field(default_factory=list)


@dataclass
class SamplingInfo:
    temperatures: torch.Tensor  # [bs, 1] device
    top_ps: torch.Tensor  # [bs] device
    top_ks: torch.Tensor  # [bs] device, vocab_size where disabled
    need_top_p: bool
    need_top_k: bool


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    out_cache_loc: torch.Tensor
    seq_lens_cpu: torch.Tensor
    seq_lens_np: np.ndarray
    qo_indptr: Optional[torch.Tensor] = None
    qo_indptr_cpu: Optional[torch.Tensor] = None
    prefix_lens_cpu: Optional[torch.Tensor] = None
    has_prefix: bool = False
    sampling: Optional[SamplingInfo] = None

    @classmethod
    def build(
        cls,
        reqs: List[Req],
        mode: ForwardMode,
        out_cache_loc: torch.Tensor,
        vocab_size: int,
        device: torch.device,
    ) -> "ForwardBatch":
        bs = len(reqs)
        seq_lens_np = np.fromiter((r.seq_len for r in reqs), dtype=np.int32, count=bs)
        extend_np = np.fromiter((r.extend_len for r in reqs), dtype=np.int32, count=bs)
        prefix_np = seq_lens_np - extend_np

        seq_lens_cpu = torch.from_numpy(seq_lens_np).pin_memory()
        pool_cpu = torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64).pin_memory()

        if mode.is_decode():
            ids_cpu = torch.tensor([r.last_token for r in reqs], dtype=torch.int64).pin_memory()
            pos_cpu = torch.from_numpy(seq_lens_np.astype(np.int64) - 1).pin_memory()
            qo_indptr_cpu = None
        else:
            qo_np = np.zeros(bs + 1, dtype=np.int32)
            np.cumsum(extend_np, out=qo_np[1:])
            qo_indptr_cpu = torch.from_numpy(qo_np).pin_memory()
            ids = list(itertools.chain.from_iterable(r.extend_ids for r in reqs))
            ids_cpu = torch.tensor(ids, dtype=torch.int64).pin_memory()
            pos_cpu = torch.from_numpy(
                np.concatenate([np.arange(p, s, dtype=np.int64) for p, s in zip(prefix_np, seq_lens_np)])
            ).pin_memory()

        temps = torch.tensor([r.temperature for r in reqs], dtype=torch.float32).pin_memory()
        top_ps = torch.tensor([r.top_p for r in reqs], dtype=torch.float32).pin_memory()
        top_k_list = [r.top_k if 0 < r.top_k < vocab_size else vocab_size for r in reqs]
        top_ks = torch.tensor(top_k_list, dtype=torch.int32).pin_memory()
        sampling = SamplingInfo(
            temperatures=temps.to(device, non_blocking=True).unsqueeze(1),
            top_ps=top_ps.to(device, non_blocking=True),
            top_ks=top_ks.to(device, non_blocking=True),
            need_top_p=any(r.top_p < 1.0 for r in reqs),
            need_top_k=any(k < vocab_size for k in top_k_list),
        )

        return cls(
            forward_mode=mode,
            batch_size=bs,
            input_ids=ids_cpu.to(device, non_blocking=True),
            positions=pos_cpu.to(device, non_blocking=True),
            req_pool_indices=pool_cpu.to(device, non_blocking=True),
            seq_lens=seq_lens_cpu.to(device, non_blocking=True),
            out_cache_loc=out_cache_loc,
            seq_lens_cpu=seq_lens_cpu,
            seq_lens_np=seq_lens_np,
            qo_indptr=None if qo_indptr_cpu is None else qo_indptr_cpu.to(device, non_blocking=True),
            qo_indptr_cpu=qo_indptr_cpu,
            prefix_lens_cpu=torch.from_numpy(prefix_np),
            has_prefix=bool(prefix_np.any()),
            sampling=sampling,
        )
