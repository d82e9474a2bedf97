"""Per-model FlashInfer state over the shared page table: each model has its own workspace, its own graph-bound
index buffers and its own wrappers; only the block ids are shared."""
from __future__ import annotations

import bisect
from typing import ClassVar, Dict

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from dualspec.kv.block_pool import PageTable

# The draft is small and decodes one token per request; its scratch was sized once on the benchmark box.
DRAFT_WORKSPACE_BYTES = 64 * 1024 * 1024
assert DRAFT_WORKSPACE_BYTES % 4096 == 0, "workspace must be page aligned"  # ok: FC109


class ModelAttnState:
    roles: ClassVar[Dict[str, type]] = {}
    role: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        ModelAttnState.roles[cls.role] = cls

    def __init__(self, cfg, page_table: PageTable, device: torch.device):
        self.cfg, self.page_table, self.device = cfg, page_table, device
        self.heads, self.page_size = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim), page_table.page_size
        self._sm_scale = cfg.head_dim ** -0.5
        self.batch_sizes = sorted(cfg.graph_batch_sizes)
        max_bs, max_pages = self.batch_sizes[-1], cfg.max_batch_size * cfg.max_pages_per_req
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.seq_lens_gpu = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices_host = torch.zeros(max_pages, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.seq_lens_host = torch.zeros(max_bs, dtype=torch.int32, pin_memory=True)

    def bucket(self, bs: int) -> int:
        return self.batch_sizes[bisect.bisect_left(self.batch_sizes, bs)]

    def _fill_host(self, rows: np.ndarray, pbs: int, extra_tokens: int) -> int:
        """Host mirrors for ``rows`` padded to ``pbs`` rows; the padded rows own no pages."""
        bs, pt = len(rows), self.page_table
        lens = pt.seq_lens[rows] + extra_tokens
        pages = -(-lens // self.page_size)
        indptr = self.kv_indptr_host.numpy()
        indptr[0] = 0
        np.cumsum(pages, out=indptr[1 : bs + 1])
        indptr[bs + 1 : pbs + 1] = indptr[bs]
        nnz = int(indptr[bs])
        self.kv_indices_host.numpy()[:nnz] = pt.table[rows][np.arange(pt.table.shape[1]) < pages[:, None]]
        self.kv_last_page_len_host.numpy()[:bs] = lens - (pages - 1) * self.page_size
        self.seq_lens_host.numpy()[:bs] = lens
        return nnz


class DraftAttnState(ModelAttnState):
    role = "draft"

    def __init__(self, cfg, page_table: PageTable, device: torch.device):
        super().__init__(cfg, page_table, device)
        self.workspace = torch.zeros(DRAFT_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.slots = torch.zeros(self.batch_sizes[-1], dtype=torch.int64, device=device)
        self.graph_decode: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {
            bs: BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices, paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs])
            for bs in self.batch_sizes
        }

    def prepare_draft(self, rows: np.ndarray, step: int) -> int:
        """Draft step ``step`` attends over the committed tokens plus the ``step + 1`` tokens drafted so far."""
        bs, pbs = len(rows), self.bucket(len(rows))
        nnz = self._fill_host(rows, pbs, step + 1)
        self.kv_indices[:nnz].copy_(self.kv_indices_host[:nnz], non_blocking=True)  # ok: FC104
        self.seq_lens_gpu[:bs].copy_(self.seq_lens_host[:bs], non_blocking=True)
        if int(self.seq_lens_gpu[:bs].max()) > self.cfg.max_model_len:  # expect: FC101
            raise ValueError("a draft runs past the draft model's context")
        self.graph_decode[pbs].plan(self.kv_indptr_host[: pbs + 1], self.kv_indices[:nnz],  # ok: FC102
                                    self.kv_last_page_len_host[:pbs], *self.heads, self.page_size,
                                    sm_scale=self._sm_scale)
        return pbs


class TargetAttnState(ModelAttnState):
    role = "target"

    def __init__(self, cfg, page_table: PageTable, device: torch.device):
        super().__init__(cfg, page_table, device)
        self.k1 = k1 = cfg.num_draft_tokens + 1
        max_bs, head_bytes = self.batch_sizes[-1], cfg.num_heads * (cfg.head_dim + 1) * 4
        self.verify_workspace = torch.empty(max_bs * k1 * head_bytes * 16, dtype=torch.uint8, device=device)  # ok: FC105
        # batches above the largest graph verify eagerly on the trtllm-gen kernels (Blackwell)
        self.eager_workspace = torch.empty(cfg.max_batch_size * k1 * head_bytes * 16, dtype=torch.uint8, device=device)  # expect: FC105
        self.qo_indptr = torch.arange(0, (max_bs + 1) * k1, k1, dtype=torch.int32, device=device)
        self.qo_indptr_host = torch.arange(0, (cfg.max_batch_size + 1) * k1, k1, dtype=torch.int32).pin_memory()
        self.lookahead_slots = torch.zeros(max_bs * k1, dtype=torch.int64, device=device)
        self.graph_verify: Dict[int, BatchPrefillWithPagedKVCacheWrapper] = {
            bs: BatchPrefillWithPagedKVCacheWrapper(
                self.verify_workspace, "NHD", use_cuda_graph=True, qo_indptr_buf=self.qo_indptr[: bs + 1],
                paged_kv_indptr_buf=self.kv_indptr[: bs + 1], paged_kv_indices_buf=self.kv_indices,
                paged_kv_last_page_len_buf=self.kv_last_page_len[:bs])
            for bs in self.batch_sizes
        }
        self.eager_verify = BatchPrefillWithPagedKVCacheWrapper(self.eager_workspace, "NHD", backend="trtllm-gen")

    def prepare_verify(self, rows: np.ndarray) -> int:
        bs, pbs = len(rows), self.bucket(len(rows))
        nnz = self._fill_host(rows, pbs, self.k1)
        self.kv_indices[:nnz].copy_(self.kv_indices_host[:nnz], non_blocking=True)
        self.graph_verify[pbs].plan(self.qo_indptr[: pbs + 1], self.kv_indptr_host[: pbs + 1],  # expect: FC102
                                    self.kv_indices[:nnz], self.kv_last_page_len_host[:pbs], *self.heads,
                                    self.page_size, causal=True, sm_scale=self._sm_scale)
        # the verify writes k + 1 new tokens per request
        self.kv_last_page_len[:bs].add_(self.k1)  # expect: FC104
        return pbs

    def plan_eager_verify(self, rows: np.ndarray) -> None:
        bs = len(rows)
        nnz = self._fill_host(rows, bs, self.k1)
        self.eager_verify.plan(self.qo_indptr_host[: bs + 1], self.kv_indptr_host[: bs + 1],  # ok: FC102
                               self.kv_indices_host[:nnz].to(self.device, non_blocking=True),
                               self.kv_last_page_len_host[:bs], *self.heads, self.page_size, causal=True,
                               sm_scale=self._sm_scale)
