"""Draft attention: graph-mode decode wrappers per bucket, a trtllm-gen eager wrapper past the
buckets, and an eager wrapper for the EAGLE-style fusion layer."""

from typing import Dict

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from spec_kernels.page_gather import gather_page_ids_kernel

from ..config import SpecConfig
from ..workspace import role_workspace
from .kv_pool import DraftKVPool


class DraftAttention:
    def __init__(self, cfg: SpecConfig, pool: DraftKVPool) -> None:
        self.cfg = cfg
        self.pool = pool
        self.page_size = cfg.page_size
        dev = cfg.device
        self.graph_ws = role_workspace("draft_graph", dev)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        eager_ws = torch.empty(cfg.draft_eager_workspace_bytes(), dtype=torch.uint8, device=dev)  # ok: FC105
        eager_ws.zero_()
        self.eager = BatchDecodeWithPagedKVCacheWrapper(eager_ws, "HND", backend="trtllm-gen")
        self.fusion = BatchDecodeWithPagedKVCacheWrapper(role_workspace("draft_fusion", dev), "HND")

    def bind_bucket(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        pool = self.pool
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_ws,
            "HND",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=pool.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=pool.kv_indices,
            paged_kv_last_page_len_buffer=pool.kv_last_page_len[:bs],
        )
        self.graph_wrappers[bs] = w
        return w

    def _plan_args(self):
        c = self.cfg
        return c.draft_qo_heads, c.draft_kv_heads, c.draft_head_dim, c.page_size

    def plan_capture(self, bs: int) -> None:
        pool = self.pool
        pool.kv_indptr_cpu[: bs + 1].copy_(torch.arange(bs + 1, dtype=torch.int32))
        pool.kv_last_page_len_cpu[:bs].fill_(1)
        h, kvh, d, page = self._plan_args()
        self.graph_wrappers[bs].plan(
            pool.kv_indptr_cpu[: bs + 1], pool.kv_indices[:bs], pool.kv_last_page_len_cpu[:bs], h, kvh, d, page,
            data_type=torch.bfloat16,
        )
        self.fusion.plan(
            pool.kv_indptr_cpu[: bs + 1], pool.kv_indices[:bs], pool.kv_last_page_len_cpu[:bs], h, kvh, d, page,
            data_type=torch.bfloat16,
        )

    def _plan_eager(self, indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor) -> None:
        h, kvh, d, page = self._plan_args()
        self.eager.plan(  # expect: FC102
            indptr, indices, last_page_len, h, kvh, d, page, data_type=torch.bfloat16
        )

    def prepare_draft_step(self, bs: int, step: int) -> None:
        """Page lists of the draft rows for draft depth ``step``, then the plans."""
        pool = self.pool
        page = self.page_size
        lens_np = pool.seq_lens_cpu[:bs] + step + 1
        pages_np = (lens_np + page - 1) // page
        indptr_np = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(pages_np, out=indptr_np[1:])
        pool.kv_indptr_cpu[: bs + 1].copy_(torch.from_numpy(indptr_np))
        pool.kv_last_page_len_cpu[:bs].copy_(torch.from_numpy((lens_np - (pages_np - 1) * page).astype(np.int32)))
        pool.kv_indptr[: bs + 1].copy_(pool.kv_indptr_cpu[: bs + 1], non_blocking=True)
        gather_page_ids_kernel[(bs,)](pool.kv_indices, pool.page_table, pool.kv_indptr, pool.page_table.stride(0), BLOCK=128)  # ok: FC104
        pool.kv_last_page_len[:bs].copy_(pool.kv_last_page_len_cpu[:bs], non_blocking=True)
        h, kvh, d, _ = self._plan_args()
        w = self.graph_wrappers.get(bs)
        if w is None:
            self._plan_eager(pool.kv_indptr_cpu[: bs + 1], pool.kv_indices, pool.kv_last_page_len[:bs])
        else:
            w.plan(  # ok: FC102
                pool.kv_indptr_cpu[: bs + 1], pool.kv_indices, pool.kv_last_page_len_cpu[:bs], h, kvh, d, page,
                data_type=torch.bfloat16,
            )
        self.fusion.plan(
            pool.kv_indptr_cpu[: bs + 1], pool.kv_indices, pool.kv_last_page_len_cpu[:bs], h, kvh, d, page,
            data_type=torch.bfloat16,
        )
