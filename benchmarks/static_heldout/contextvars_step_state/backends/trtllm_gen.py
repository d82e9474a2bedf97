"""trtllm-gen decode: graph-mode wrappers per bucket, an eager MTP draft wrapper and the raw kernel."""
from typing import Dict, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from ctxserve.config import TRTLLM_WS_MB, ServeConfig
from ctxserve.context import current_batch, host_staging, is_capturing

class TrtllmGenDecode:
    def __init__(self, cfg: ServeConfig, device: torch.device):
        self.cfg, self.device, self._backend = cfg, device, "trtllm-gen"  # ok: FC103
        max_bs, i32 = cfg.max_running_requests, torch.int32
        self.workspace = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.draft_workspace = torch.zeros(TRTLLM_WS_MB["draft"] << 20, dtype=torch.uint8, device=device)  # expect: FC106
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=i32, device=device)
        self.kv_indices = torch.zeros(cfg.num_pages, dtype=i32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=i32, device=device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=i32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=i32, pin_memory=True)
        self.wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.draft_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.draft_workspace, "HND", backend=self._backend)
        self.block_tables: Optional[torch.Tensor] = None
        self.raw_workspace: Optional[torch.Tensor] = None
    def heads(self):
        c = self.cfg
        return c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size
    def init_cuda_graph_state(self, buckets):
        self.kv_last_page_len.fill_(1)  # ok: FC104
        for bs in buckets:
            self.wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "HND", use_cuda_graph=True, backend=self._backend,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1], paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs])
    def plan_capture(self, bs: int):
        self.kv_indptr_cpu[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.wrappers[bs].plan(self.kv_indptr_cpu[: bs + 1], self.kv_indices[:bs], self.kv_last_page_len_cpu[:bs], *self.heads())  # ok: FC102
    def plan_bucket(self, bs: int):
        batch = current_batch()
        self._check_capacity(bs)
        raw_bs = batch.batch_size
        self.kv_indptr_cpu[: raw_bs + 1].copy_(batch.kv_indptr_cpu)
        self.kv_indptr_cpu[raw_bs + 1 : bs + 1] = batch.kv_indptr_cpu[raw_bs]
        self.kv_last_page_len_cpu[:raw_bs].copy_(batch.kv_last_page_len_cpu)
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        num_pages = int(self.kv_indptr_cpu[bs])  # ok: FC101
        self.wrappers[bs].plan(self.kv_indptr_cpu[: bs + 1], batch.kv_indices[:num_pages], self.kv_last_page_len_cpu[:bs],  # ok: FC102
                               *self.heads())
        self.kv_last_page_len[raw_bs:bs].fill_(1)  # expect: FC104
    def _check_capacity(self, bs: int):
        assert bs in self.wrappers, f"no trtllm-gen graph wrapper for bucket {bs}"  # expect: FC109
    def plan_draft(self):
        """The MTP head plans over the same pages as the target step."""
        batch, staged = current_batch(), host_staging()
        staged["draft_indptr"] = batch.kv_indptr
        self.draft_wrapper._use_cuda_graph = is_capturing()  # expect: FC103
        self.draft_wrapper.plan(staged["draft_indptr"], batch.kv_indices, batch.kv_last_page_len_cpu, *self.heads())  # expect: FC102
    def forward(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        w = self.wrappers.get(q.shape[0])
        if w is None:
            return self.decode_raw(q, kv_cache)
        return w.run(q, kv_cache)  # ok: FC108
    def forward_draft(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.draft_wrapper.run(q, kv_cache)  # expect: FC108
    def prepare_raw(self):
        """Block tables for the raw kernel, used above the largest captured bucket."""
        batch, c = current_batch(), self.cfg
        bs, num_pages = batch.batch_size, int(batch.kv_indptr_cpu[-1])  # ok: FC101
        self.block_tables = torch.zeros(bs, c.context_len // c.page_size, dtype=torch.int32, device=self.device)  # expect: FC107
        lens = batch.kv_indptr[1:] - batch.kv_indptr[:-1]
        rows = torch.repeat_interleave(torch.arange(bs, device=self.device), lens, output_size=num_pages)  # ok: FC101
        self.block_tables[rows, torch.arange(num_pages, device=self.device) - batch.kv_indptr[rows]] = batch.kv_indices[:num_pages]
    def decode_raw(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        seq_lens = current_batch().seq_lens
        max_len = seq_lens.max().item()  # expect: FC101
        if self.raw_workspace is None:
            self.raw_workspace = torch.empty_like(self.workspace)  # expect: FC105
        return trtllm_batch_decode_with_kv_cache(q, kv_cache, self.raw_workspace, self.block_tables, seq_lens, max_len,
                                                 bmm1_scale=self.cfg.head_dim**-0.5, bmm2_scale=1.0)
    def reset_pages(self):
        """Called by the runner after an abort: forget every page id the graph wrappers hold."""
        self.kv_indices.zero_()  # expect: FC104
