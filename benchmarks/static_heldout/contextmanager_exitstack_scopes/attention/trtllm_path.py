"""trtllm-gen path: graph-mode decode wrappers per bucket, the MTP draft wrapper and the raw kernel."""
from __future__ import annotations

import contextlib
import math
from typing import Dict, Iterator, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from scopes.batch import DecodeBatch
from scopes.config import EngineConfig


class TrtllmGenPath:
    GRAPH_WORKSPACE_BYTES = 256 << 20

    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        self.cfg, self.device = cfg, device
        max_bs = cfg.graph_buckets[-1]
        self.graph_workspace = torch.zeros(self.GRAPH_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.indices_buf = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.last_page_buf = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        draft_workspace = torch.empty(cfg.split_kv_workspace_bytes() // 2, dtype=torch.uint8, device=device)  # expect: FC105
        self.draft_wrapper = BatchDecodeWithPagedKVCacheWrapper(draft_workspace, "HND", backend="trtllm-gen")
        self._kernel_ws = self.block_tables = self.seq_lens_dev = None
        self.step_batch: Optional[DecodeBatch] = None

    def init_graph_wrappers(self) -> None:
        for bs in self.cfg.graph_buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace, "HND", use_cuda_graph=True, backend="trtllm-gen",
                paged_kv_indptr_buffer=self.indptr_buf[: bs + 1], paged_kv_indices_buffer=self.indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_buf[:bs])

    def plan_bucket(self, bs: int, batch: DecodeBatch) -> None:
        n = batch.num_reqs
        self.indices_buf[: batch.num_pages].copy_(batch.kv_indices, non_blocking=True)  # ok: FC104
        self.indptr_cpu[: n + 1].copy_(batch.kv_indptr_cpu)
        self.indptr_cpu[n + 1 : bs + 1] = batch.kv_indptr_cpu[n]
        self.last_page_cpu[:n].copy_(batch.kv_last_page_len_cpu)
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.indptr_cpu[: bs + 1], self.indices_buf, self.last_page_cpu[:bs], *self.cfg.plan_dims(), data_type=torch.bfloat16)
        # Stale page ids past the live ones would be read by padded rows.
        self.indices_buf[batch.num_pages :].zero_()  # expect: FC104

    @contextlib.contextmanager
    def graph_mode(self, wrapper: BatchDecodeWithPagedKVCacheWrapper) -> Iterator[BatchDecodeWithPagedKVCacheWrapper]:
        # Let the eager draft wrapper be captured inside the target's decode graph.
        prev = wrapper._use_cuda_graph  # expect: FC103
        wrapper._use_cuda_graph = True  # expect: FC103
        try:
            yield wrapper
        finally:
            wrapper._use_cuda_graph = prev  # expect: FC103

    def plan_draft(self, batch: DecodeBatch) -> None:
        cfg = self.cfg
        kwargs = dict(indptr=batch.kv_indptr, indices=batch.kv_indices, last_page_len=batch.kv_last_page_len_cpu,
                      num_qo_heads=cfg.num_qo_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                      page_size=cfg.page_size)
        self.draft_wrapper.plan(**kwargs)  # expect: FC102

    def prepare_direct(self, batch: DecodeBatch) -> None:
        # Block tables and lengths for the raw kernel (batches above the largest bucket).
        assert batch.block_tables.dim() == 2, "block_tables must be [num_reqs, max_blocks]"  # expect: FC109
        max_blocks = math.ceil(self.cfg.max_seq_len / self.cfg.page_size)  # ok: FC101
        n = int(batch.seq_lens.numel())  # ok: FC101
        self.step_batch = batch
        self.block_tables = torch.zeros(n, max_blocks, dtype=torch.int32, device=self.device)  # expect: FC107
        self.block_tables[:, : batch.block_tables.shape[1]] = batch.block_tables  # ok: FC101
        self.seq_lens_dev = torch.zeros(self.cfg.max_batch_size, dtype=torch.int32, device=self.device) if self.seq_lens_dev is None else self.seq_lens_dev  # ok: FC107
        self.seq_lens_dev[:n].copy_(batch.seq_lens)

    def _kernel_workspace(self) -> torch.Tensor:
        if self._kernel_ws is None:
            self._kernel_ws = torch.empty(self.cfg.split_kv_workspace_bytes(), dtype=torch.uint8, device=self.device)  # expect: FC105
        return self._kernel_ws

    def decode_direct(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        batch = self.step_batch
        live = (batch.seq_lens > 0).nonzero().squeeze(1)  # expect: FC101
        out = trtllm_batch_decode_with_kv_cache(q[live], kv_cache, self._kernel_workspace(), self.block_tables[live],
                                                self.seq_lens_dev[live], self.cfg.max_seq_len, bmm1_scale=self.cfg.head_dim ** -0.5, bmm2_scale=1.0)
        full = torch.zeros_like(q).index_copy_(0, live, out)
        return torch.where(batch.seq_lens.view(-1, 1, 1) > 0, full, torch.zeros_like(full))  # ok: FC101
