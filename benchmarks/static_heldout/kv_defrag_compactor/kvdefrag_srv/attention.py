"""Paged decode attention over a KV cache that a background compactor rearranges.

Graph-mode decode wrappers (one per bucket) read the shared ``kv_indptr`` / ``kv_indices`` /
``kv_last_page_len`` buffers by address.  Pages that are being copied while a step runs are attended
through a shadow wrapper at their source ids and merged by LSE.
"""

from dataclasses import dataclass
from typing import Dict, List

import flashinfer
import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from kvdefrag.config import PREFILL_WORKSPACE_BYTES, DefragConfig
from kvdefrag.kernels.copy_pages import remap_page_ids
from kvdefrag.pages import PagePool
from kvdefrag.remap import RemapTable


@dataclass
class PrefillBatch:
    qo_indptr: torch.Tensor
    kv_indptr_host: torch.Tensor
    num_tokens: int


class DefragAttention:
    def __init__(self, cfg: DefragConfig, pool: PagePool, remap: RemapTable, device: torch.device):
        self.cfg = cfg
        self.pool = pool
        self.remap = remap
        self.device = device
        max_bs = cfg.max_batch
        max_idx = max_bs * cfg.max_pages_per_seq

        # bound to every graph-mode wrapper below
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices = torch.zeros(max_idx, dtype=torch.int32, device=self.device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        # pinned host mirrors: what plan() reads
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices_host = torch.zeros(max_idx, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        # page list of the eager (no-graph) step: a plan() argument, not a wrapper buffer
        self.eager_kv_indices = torch.zeros(max_idx, dtype=torch.int32, device=self.device)
        self.eager_total = 0
        self.last_bs = 1

        self.graph_workspace = torch.zeros(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=self.device)  # ok: FC106
        self.eager_workspace = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=self.device)  # ok: FC105
        self.prefill_workspace = torch.zeros(PREFILL_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.trtllm_workspace = torch.empty(cfg.trtllm_workspace_bytes(), dtype=torch.uint8, device=self.device)  # expect: FC105

        layout = self.pool._kv_layout  # ok: FC103
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        for bs in cfg.buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                layout,
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
                backend="fa2",
            )
        self.overflow_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.eager_workspace, layout, backend="fa2")
        self.shadow_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.eager_workspace, layout, backend="fa2")
        self.prefill_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, layout)
        self.init_graph_buffers()

    def init_graph_buffers(self) -> None:
        self.kv_indptr.zero_()
        self.kv_last_page_len.fill_(1)  # ok: FC104

    def _shape_kwargs(self):
        c = self.cfg
        return dict(
            num_qo_heads=c.num_qo_heads,
            num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            page_size=c.page_size,
            q_data_type=torch.bfloat16,
        )

    # ---- capture -------------------------------------------------------------------------------
    def ready_bucket(self, bs: int) -> None:
        """Plan bucket ``bs`` over a dummy batch (one page per row) so that it can be captured."""
        self.kv_indptr_host[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.kv_indices_host[:bs] = 0
        self.kv_last_page_len_host[:bs] = 1
        self.graph_wrappers[bs].plan(
            self.kv_indptr_host[: bs + 1],
            self.kv_indices_host[:bs],
            self.kv_last_page_len_host[:bs],
            **self._shape_kwargs(),
        )
        self.plan_shadow(bs, {})

    # ---- per step --------------------------------------------------------------------------------
    def prepare_decode(self, bs: int, n_pages_np: np.ndarray, last_len_np: np.ndarray, page_ids_np: np.ndarray) -> None:
        """Fill the graph-bound buffers of bucket ``bs`` and plan it; runs before every replay."""
        n = n_pages_np.shape[0]
        self.kv_indptr_host[0] = 0
        self.kv_indptr_host[1 : n + 1] = torch.from_numpy(np.cumsum(n_pages_np, dtype=np.int32))
        self.kv_indptr_host[n + 1 : bs + 1] = self.kv_indptr_host[n]
        total = int(self.kv_indptr_host[bs])  # ok: FC101
        self.kv_indices_host[:total] = torch.from_numpy(page_ids_np)
        self.kv_last_page_len_host[:n] = torch.from_numpy(last_len_np)
        self.kv_last_page_len_host[n:bs] = 1

        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_host[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:total].copy_(self.kv_indices_host[:total], non_blocking=True)
        self.kv_last_page_len[:bs].copy_(self.kv_last_page_len_host[:bs], non_blocking=True)
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1],
            self.kv_indices_host[:total],
            self.kv_last_page_len_host[:bs],
            **self._shape_kwargs(),
        )
        self.last_bs = bs
        if self.remap.has_pending():
            # pages the compactor queued after the engine built this batch's page lists
            remap_page_ids(self.kv_indices[:total], self.remap.map_gpu)  # expect: FC104

    def plan_shadow(self, bs: int, inflight: Dict[int, List[int]]) -> None:
        """Plan the shadow wrapper over the pages still being copied, read at their source ids."""
        counts = [len(inflight.get(r, ())) for r in range(bs)]
        indptr = torch.tensor(np.concatenate([[0], np.cumsum(counts)]), dtype=torch.int32)
        ids = [p for r in range(bs) for p in inflight.get(r, ())]
        indices = torch.tensor(ids or [0], dtype=torch.int32)
        last = torch.full((bs,), self.cfg.page_size, dtype=torch.int32)
        self.shadow_wrapper.plan(indptr, indices, last, **self._shape_kwargs())  # ok: FC102

    def plan_eager(self, bs: int, n_pages: torch.Tensor, total: int, last_len_host: torch.Tensor) -> None:
        """Plan the eager wrapper for a batch larger than the largest bucket."""
        indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(n_pages, 0, dtype=torch.int32, out=indptr[1:])
        self.overflow_wrapper.plan(  # expect: FC102
            indptr,
            self.eager_kv_indices[:total],
            last_len_host,
            **self._shape_kwargs(),
        )

    def plan_prefill(self, batch: PrefillBatch) -> None:
        c = self.cfg
        self.prefill_wrapper.plan(  # expect: FC102
            batch.qo_indptr,
            batch.kv_indptr_host,
            c.num_qo_heads,
            c.num_kv_heads,
            c.head_dim,
            causal=True,
            q_data_type=torch.bfloat16,
        )

    # ---- kernels ---------------------------------------------------------------------------------
    def forward_decode(self, q: torch.Tensor, layer: int, bs: int) -> torch.Tensor:
        kv = self.pool.kv_cache[layer]
        if bs in self.graph_wrappers:
            w = self.graph_wrappers[bs]
        else:
            w = self.overflow_wrapper
        o, lse = w.run(q, kv, return_lse=True)  # ok: FC108
        o_shadow, lse_shadow = self.shadow_wrapper.run_return_lse(q, kv)  # expect: FC108
        out, _ = flashinfer.merge_state(o, lse, o_shadow, lse_shadow)
        return out

    def forward_prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.prefill_wrapper.run(q, k, v)

    def forward_long(self, q, layer: int, block_tables: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        return trtllm_batch_decode_with_kv_cache(
            q,
            self.pool.kv_cache[layer],
            self.trtllm_workspace,
            block_tables,
            seq_lens,
            c.max_pages_per_seq * c.page_size,
            bmm1_scale=c.head_dim ** -0.5,
            bmm2_scale=1.0,
        )
