"""Chunked prefill of long prompts: a chunk of up to ``chunk_size`` tokens per step."""
from __future__ import annotations

import collections
import dataclasses
import os
from typing import Deque, List, Optional

import numpy as np
import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from yarnserve.attn.decode import BandDecodeAttention
from yarnserve.bands import BandTable
from yarnserve.kv_pool import PagedKVPool
from yarnserve.settings import ServeSettings


@dataclasses.dataclass
class PromptJob:
    row: int
    length: int
    band_index: int
    done: int = 0


@dataclasses.dataclass
class ChunkPlan:
    rows_np: np.ndarray
    lens_np: np.ndarray
    row_of_token: torch.Tensor
    num_tokens: int


class ChunkedPrefillPlanner:
    def __init__(
        self,
        settings: ServeSettings,
        table: BandTable,
        pool: PagedKVPool,
        decode: BandDecodeAttention,
        device: torch.device,
    ) -> None:
        self.settings = settings
        self.table = table
        self.pool = pool
        self.decode = decode
        self.device = device
        self.prefill_workspace = torch.zeros(int(os.environ.get("YARN_PREFILL_WS_BYTES", 256 << 20)), dtype=torch.uint8, device=device)  # expect: FC106
        ctx_ws = torch.empty(settings.context_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        ctx_ws.zero_()
        self.ctx_workspace = ctx_ws
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "HND")
        self.pending: Deque[PromptJob] = collections.deque()

    def has_pending(self) -> bool:
        return bool(self.pending)

    def submit(self, job: PromptJob) -> None:
        self.pending.append(job)

    def _take_chunk(self) -> List[PromptJob]:
        budget = self.settings.chunk_size
        jobs: List[PromptJob] = []
        for job in self.pending:
            if budget <= 0:
                break
            jobs.append(job)
            budget -= job.length - job.done
        return jobs

    def next_chunk(self) -> Optional[ChunkPlan]:
        jobs = self._take_chunk()
        if not jobs:
            return None
        ps = self.settings.page_size
        budget = self.settings.chunk_size
        rows, lens, kv_lens = [], [], []
        for job in jobs:
            n = min(budget, job.length - job.done)
            rows.append(job.row)
            lens.append(n)
            kv_lens.append(job.done + n)
            budget -= n
        rows_np = np.asarray(rows, dtype=np.int64)
        lens_np = np.asarray(lens, dtype=np.int32)
        kv_pages = (np.asarray(kv_lens) + ps - 1) // ps
        qo_indptr_cpu = torch.zeros(len(rows) + 1, dtype=torch.int32)
        qo_indptr_cpu[1:] = torch.from_numpy(np.cumsum(lens_np))
        kv_indptr_cpu = torch.zeros(len(rows) + 1, dtype=torch.int32)
        kv_indptr_cpu[1:] = torch.from_numpy(np.cumsum(kv_pages).astype(np.int32))
        kv_indices = torch.from_numpy(
            np.concatenate([self.pool.page_table_np[r, :p] for r, p in zip(rows_np, kv_pages)])
        ).to(self.device, non_blocking=True)
        rows_dev = torch.from_numpy(rows_np).to(self.device)
        band = self.table[max(j.band_index for j in jobs)]
        s = self.settings
        self.prefill.plan(  # expect: FC102
            qo_indptr_cpu,
            kv_indptr_cpu,
            kv_indices,
            self.pool.last_page_len_gpu[rows_dev],
            s.num_q_heads,
            s.num_kv_heads,
            s.head_dim,
            s.page_size,
            causal=True,
            sm_scale=band.sm_scale(s.head_dim),
            q_data_type=s.dtype,
        )
        # page ids of the chunk's new pages, gathered for the KV append kernel; the decode
        # graphs are idle during prefill so their index buffer serves as scratch
        first_new = int(jobs[0].done // ps)
        k = int(kv_pages[0]) - first_new
        page_range = torch.arange(first_new, first_new + k, device=self.device)
        torch.index_select(self.pool.page_table_dev[rows_np[0]], 0, page_range, out=self.decode.graph_kv_indices[:k])  # expect: FC104
        total = int(lens_np.sum())
        lens_dev = torch.from_numpy(lens_np).to(self.device, non_blocking=True)
        row_of_token = torch.repeat_interleave(rows_dev, lens_dev, output_size=total)  # ok: FC101
        for job, n in zip(jobs, lens):
            job.done += n
        while self.pending and self.pending[0].done >= self.pending[0].length:
            self.pending.popleft()
        return ChunkPlan(rows_np=rows_np, lens_np=lens_np, row_of_token=row_of_token, num_tokens=total)

    def run_context(self, q: torch.Tensor, layer_id: int, chunk: ChunkPlan, block_tables: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        s = self.settings
        return trtllm_batch_context_with_kv_cache(
            query=q,
            kv_cache=self.pool.layers_kv[layer_id],
            workspace_buffer=self.ctx_workspace,
            block_tables=block_tables,
            seq_lens=seq_lens,
            max_q_len=int(chunk.lens_np.max()),
            max_kv_len=s.max_pages_per_req * s.page_size,
            bmm1_scale=s.head_dim ** -0.5,
            bmm2_scale=1.0,
            batch_size=len(chunk.rows_np),
            cum_seq_lens_q=None,
            cum_seq_lens_kv=None,
        )

    def run_prefill(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        return self.prefill.run(q, self.pool.layers_kv[layer_id])
