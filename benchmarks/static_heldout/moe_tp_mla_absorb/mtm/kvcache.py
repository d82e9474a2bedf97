"""Latent KV pool (one token per slot), request-to-token table and the per-step ForwardBatch."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch
import triton
import triton.language as tl

from mtm.config import EngineConfig


@dataclass
class ForwardBatch:
    mode: str  # "decode" | "extend"
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    req_pool_indices: torch.Tensor
    out_cache_loc: torch.Tensor
    extend_lens_cpu: Optional[torch.Tensor] = None

    @property
    def is_decode(self) -> bool:
        return self.mode == "decode"

    @property
    def batch_size(self) -> int:
        return self.seq_lens_cpu.shape[0]

    @property
    def max_seq_len(self) -> int:
        return int(self.seq_lens_cpu.max())


class MLAKVPool:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        m = cfg.model
        n = cfg.max_total_tokens
        width = m.kv_lora_rank + m.qk_rope_head_dim  # [c_kv | k_pe]: FlashInfer reads halves, trtllm-gen rows
        self.kv = [torch.zeros(n, 1, width, dtype=torch.bfloat16, device=device) for _ in range(m.num_layers)]
        self.ckv = [t[..., : m.kv_lora_rank] for t in self.kv]
        self.kpe = [t[..., m.kv_lora_rank :] for t in self.kv]
        self.index_k = [torch.zeros(n, m.index_head_dim, dtype=torch.bfloat16, device=device) for _ in range(m.num_layers)]
        self.req_to_token = torch.zeros(cfg.max_running_requests, cfg.max_context_len, dtype=torch.int32, device=device)
        self.free_slots = np.arange(n - 1, 0, -1, dtype=np.int64)  # slot 0 is the padding slot
        self.num_free = n - 1
        self.free_reqs: List[int] = list(range(cfg.max_running_requests))

    def alloc_slots(self, k: int) -> np.ndarray:
        if k > self.num_free:
            raise RuntimeError(f"KV pool exhausted: need {k} slots, {self.num_free} free")
        self.num_free -= k
        return self.free_slots[self.num_free : self.num_free + k].copy()

    def free(self, slots: np.ndarray) -> None:
        self.free_slots[self.num_free : self.num_free + slots.size] = slots
        self.num_free += int(slots.size)


@triton.jit
def create_kv_indices_kernel(req_to_token_ptr, req_pool_indices_ptr, kv_indptr_ptr, seq_lens_ptr, kv_indices_ptr,
                             stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    blk = tl.program_id(1)
    req = tl.load(req_pool_indices_ptr + row)
    start = tl.load(kv_indptr_ptr + row)
    n = tl.load(seq_lens_ptr + row)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    slots = tl.load(req_to_token_ptr + req * stride + offs, mask=mask)
    tl.store(kv_indices_ptr + start + offs, slots, mask=mask)


def append_decode_slots_(kv_indices: torch.Tensor, row_ends: torch.Tensor, slots: torch.Tensor) -> None:
    """Write each row's newest token slot at the end of its segment, in place."""
    kv_indices.index_copy_(0, row_ends.long(), slots.to(kv_indices))
