"""trtllm-gen decode: graph-mode wrappers per bucket, an eager MTP draft wrapper, raw kernels."""
import math
import os
from typing import Dict, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from dwserve.batch import ForwardBatch
from dwserve.config import ServeConfig
from dwserve.decorators import traced


class TrtllmGenDecode:
    def __init__(self, cfg: ServeConfig, device: torch.device):
        self.cfg, self.device, max_bs, i32 = cfg, device, cfg.max_batch_size, torch.int32
        self.workspace = torch.empty(cfg.trtllm_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.draft_workspace = torch.zeros(int(os.environ.get("DWSERVE_DRAFT_WS_MB", "96")) << 20, dtype=torch.uint8, device=device)  # expect: FC106
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=i32, device=device)
        self.kv_indices = torch.zeros(cfg.max_total_pages, dtype=i32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=i32, device=device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=i32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=i32, pin_memory=True)
        self.wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {
            bs: BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "HND", use_cuda_graph=True, backend="trtllm-gen",
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1], paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs])
            for bs in cfg.buckets
        }
        self.draft_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.draft_workspace, "HND", backend="trtllm-gen")
        self.block_tables: Optional[torch.Tensor] = None
        self.raw_workspace: Optional[torch.Tensor] = None  # allocated on first use of the raw kernel
    @traced("plan")
    def plan_bucket(self, batch: ForwardBatch, bs: int):
        c, raw_bs = self.cfg, batch.batch_size
        self.kv_indptr_cpu[: raw_bs + 1].copy_(batch.kv_indptr_cpu)
        self.kv_indptr_cpu[raw_bs + 1 : bs + 1] = batch.kv_indptr_cpu[raw_bs]
        self.kv_last_page_len_cpu[:raw_bs].copy_(batch.kv_last_page_len_cpu)
        self.kv_last_page_len_cpu[raw_bs:bs] = 1
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        num_pages = int(self.kv_indptr_cpu[bs])  # ok: FC101
        self.wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1], batch.kv_indices[:num_pages], self.kv_last_page_len_cpu[:bs],
            c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size, q_data_type=torch.bfloat16)
        # stale page ids right past the live ones must never be followed by the multi-CTA kernels
        self.kv_indices[num_pages : num_pages + c.page_size].zero_()  # expect: FC104
    @traced("plan")
    def plan_draft(self, batch: ForwardBatch):
        c = self.cfg
        kwargs = dict(indptr=batch.kv_indptr, indices=batch.kv_indices, last_page_len=batch.kv_last_page_len_cpu,
                      num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
                      page_size=c.page_size, q_data_type=torch.bfloat16)
        self.draft_wrapper.plan(**kwargs)  # expect: FC102
    def forward(self, q: torch.Tensor, kv_cache: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        if q.shape[0] not in self.wrappers:
            return self.decode_direct(q, kv_cache, batch)
        return self.wrappers[q.shape[0]].run(q, kv_cache)  # ok: FC108
    def forward_draft(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.draft_wrapper.run(q, kv_cache)  # expect: FC108
    @traced("metadata")
    def prepare_direct(self, batch: ForwardBatch):
        c, bs = self.cfg, batch.batch_size
        max_pages = math.ceil(c.max_seq_len / c.page_size)  # ok: FC101
        if self.block_tables is None or self.block_tables.shape[0] < bs:
            self.block_tables = torch.zeros(bs, max_pages, dtype=torch.int32, device=self.device)  # expect: FC107
        num_pages = int(batch.kv_indptr_cpu[-1])  # ok: FC101
        lens = batch.kv_indptr[1:] - batch.kv_indptr[:-1]
        rows = torch.repeat_interleave(torch.arange(bs, device=self.device), lens, output_size=num_pages)  # ok: FC101
        cols = torch.arange(num_pages, device=self.device) - batch.kv_indptr[rows]
        self.block_tables[rows, cols] = batch.kv_indices[:num_pages]
    def _raw_workspace(self) -> torch.Tensor:
        if self.raw_workspace is None:
            self.raw_workspace = self.workspace.new_empty(self.cfg.trtllm_workspace_bytes())  # expect: FC105
        return self.raw_workspace
    def decode_direct(self, q: torch.Tensor, kv_cache: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        max_len = batch.seq_lens.max().item()  # expect: FC101
        return trtllm_batch_decode_with_kv_cache(q, kv_cache, self._raw_workspace(), self.block_tables, batch.seq_lens,
                                                 max_len, bmm1_scale=self.cfg.head_dim ** -0.5, bmm2_scale=1.0)
