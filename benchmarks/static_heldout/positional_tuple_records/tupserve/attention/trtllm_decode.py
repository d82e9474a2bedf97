"""Blackwell decode through FlashInfer's trtllm-gen kernel.

The kernel takes a dense block table instead of (indptr, indices), so the step's
flat page list is scattered into ``block_tables`` row by row before the forward.
"""

from __future__ import annotations

import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from ..config import EngineConfig, trtllm_workspace_bytes
from ..slots import BATCH_SIZE, KV_INDICES, KV_INDPTR, SEQ_LENS


class TrtllmDecodePath:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        nbytes = trtllm_workspace_bytes(cfg)
        self.workspace = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
        self.block_tables = torch.zeros(
            cfg.max_batch_size, cfg.max_pages_per_req, dtype=torch.int32, device=device
        )
        self.seq_lens = torch.ones(cfg.max_batch_size, dtype=torch.int32, device=device)
        self.sm_scale = cfg.head_dim**-0.5
        self.max_seq_len = cfg.max_seq_len

    def prepare(self, meta: tuple) -> None:
        """Scatter the record's page list into the block table (eager and replay)."""
        bs = meta[BATCH_SIZE]
        kv_indptr_d, kv_indptr_h = meta[KV_INDPTR]
        widest = int((kv_indptr_d[1:] - kv_indptr_d[:-1]).max())  # expect: FC101
        if widest > self.block_tables.shape[1]:
            # rope-scaled requests may run past max_seq_len
            self.block_tables.resize_(self.block_tables.shape[0], widest)  # expect: FC107
        ptr = kv_indptr_h.tolist()  # ok: FC101
        kv_indices = meta[KV_INDICES]
        for i in range(bs):
            n = ptr[i + 1] - ptr[i]
            self.block_tables[i, :n] = kv_indices[ptr[i] : ptr[i + 1]]
        seq_lens_d, _ = meta[SEQ_LENS]
        self.seq_lens[:bs].copy_(seq_lens_d, non_blocking=True)

    def decode(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: tuple) -> torch.Tensor:
        bs = meta[BATCH_SIZE]
        return trtllm_batch_decode_with_kv_cache(
            query=q,
            kv_cache=kv_cache,
            workspace_buffer=self.workspace,
            block_tables=self.block_tables[:bs],
            seq_lens=self.seq_lens[:bs],
            max_seq_len=self.max_seq_len,
            bmm1_scale=self.sm_scale,
            bmm2_scale=1.0,
        )
