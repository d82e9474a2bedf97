"""Direct trtllm-gen decode for batches above the largest graph bucket."""

from __future__ import annotations

import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from aiostep import EngineConfig, ScheduledBatch
from attn.backend import AsyncFlashInferBackend


class TrtllmDecodePath:
    def __init__(self, cfg: EngineConfig, backend: AsyncFlashInferBackend, device: torch.device):
        assert cfg.page_size in (16, 32, 64), "trtllm-gen supports pages of 16, 32 or 64 tokens"  # expect: FC109
        self.cfg = cfg
        self.workspace = torch.empty(cfg.trtllm_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.block_tables = torch.zeros(cfg.max_batch, cfg.max_pages_per_req, dtype=torch.int32, device=device)
        self.draft_on_trtllm = backend.draft_wrapper._backend == "trtllm-gen"  # expect: FC103
        self.bmm1_scale = backend._sm_scale  # ok: FC103

    def _block_table(self, batch: ScheduledBatch) -> torch.Tensor:
        table = self.block_tables[: batch.batch_size]
        col = torch.arange(table.shape[1], device=table.device)
        idx = (batch.kv_indptr[:-1, None] + col[None, :]).clamp_(max=batch.kv_indices.numel() - 1)
        return table.copy_(batch.kv_indices[idx])

    def decode(self, q: torch.Tensor, kv_cache: torch.Tensor, batch: ScheduledBatch) -> torch.Tensor:
        if batch.batch_size > self.block_tables.shape[0]:
            self.block_tables = torch.zeros(batch.batch_size, self.cfg.max_pages_per_req, dtype=torch.int32, device=q.device)  # expect: FC107
        seq_lens = torch.where(batch.seq_lens > 0, batch.seq_lens, 1)  # ok: FC101
        max_seq_len = int(seq_lens.max())  # expect: FC101
        return trtllm_batch_decode_with_kv_cache(
            query=q, kv_cache=kv_cache, workspace_buffer=self.workspace, block_tables=self._block_table(batch),
            seq_lens=seq_lens, max_seq_len=max_seq_len, bmm1_scale=self.bmm1_scale, bmm2_scale=1.0,
        )
