"""trtllm-gen decode through FlashInfer's functional API (no wrapper, no planner).

The kernel keeps its multi-CTA semaphores in ``workspace``; bucket runners either share the
prototype's (``copy.copy``) or get their own (``copy.deepcopy``) when graphs may replay
concurrently on different streams.
"""

from __future__ import annotations

import math
from typing import Dict

import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from protoserve.config import EngineConfig
from protoserve.metadata import StepMetadata


class TrtllmDecodeKernel:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.workspace = torch.zeros(cfg.workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.max_pages_per_req = cfg.max_context_len // cfg.page_size
        self.block_tables = torch.zeros(
            cfg.max_batch_size, self.max_pages_per_req, dtype=torch.int32, device=device
        )
        self.bmm1_scale = 1.0 / math.sqrt(cfg.head_dim)

    def __copy__(self) -> "TrtllmDecodeKernel":
        new = TrtllmDecodeKernel.__new__(TrtllmDecodeKernel)
        new.__dict__.update(self.__dict__)
        return new

    def __deepcopy__(self, memo: Dict[int, object]) -> "TrtllmDecodeKernel":
        new = TrtllmDecodeKernel.__new__(TrtllmDecodeKernel)
        memo[id(self)] = new
        new.cfg = self.cfg
        new.device = self.device
        new.max_pages_per_req = self.max_pages_per_req
        new.bmm1_scale = self.bmm1_scale
        new.workspace = torch.empty_like(self.workspace)  # expect: FC105
        new.block_tables = torch.zeros_like(self.block_tables)
        return new

    def load_block_tables(self, page_table: torch.Tensor, bs: int) -> None:
        """``page_table`` is the scheduler's [bs, max_pages_per_req] slice of req_to_page."""
        self.block_tables[:bs, : page_table.shape[1]].copy_(page_table, non_blocking=True)

    def run_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: StepMetadata) -> torch.Tensor:
        bs = meta.bucket
        return trtllm_batch_decode_with_kv_cache(
            query=q,
            kv_cache=kv_cache,
            workspace_buffer=self.workspace,
            block_tables=self.block_tables[:bs],
            seq_lens=meta.seq_lens[:bs],
            max_seq_len=meta.max_seq_len,
            bmm1_scale=self.bmm1_scale,
            bmm2_scale=1.0,
        )
