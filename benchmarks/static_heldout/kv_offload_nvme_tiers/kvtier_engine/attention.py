"""FlashInfer attention over the GPU tier.

Decode batches that fit a graph bucket run graph-mode wrappers bound to the persistent
``kv_indptr`` / ``kv_indices`` / ``kv_last_page_len``; the staged layers (whose KV is
refilled from the host every step) run an eager wrapper over the staging pool.
"""

from typing import TYPE_CHECKING, Dict, Optional

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)

from kvtier.config import MIN_EAGER_WS_BYTES, RAGGED_WS_BYTES, TierConfig
from kvtier.page_table import exclusive_cumsum
from kvtier.tools.nvme_io import NvmeStore
from kvtier.workspace import get_extend_workspace, make_workspace

if TYPE_CHECKING:
    from kvtier_engine.server import StepBatch


class TieredAttention:
    def __init__(self, cfg: TierConfig, kv_cache: torch.Tensor, staging_kv: torch.Tensor, store: NvmeStore, device):
        self.cfg = cfg
        self.device = device
        self.kv_cache = kv_cache
        self.staging_kv = staging_kv
        self.store = store
        self._backend = "trtllm-gen" if cfg.use_trtllm_gen else "fa2"
        max_bs = cfg.max_batch_size
        self.capturing = False

        self.decode_ws = torch.zeros(cfg.decode_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        eager_bytes = max(MIN_EAGER_WS_BYTES, cfg.max_batch_size * cfg.num_qo_heads * 16 * (cfg.head_dim + 1) * 4)
        self.eager_ws = torch.empty(eager_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.ragged_ws = torch.empty(RAGGED_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.staged_ws = make_workspace(cfg.staged_workspace_bytes(), device)

        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(cfg.max_pages_per_step, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.extend_kv_indices = torch.zeros(cfg.max_pages_per_step, dtype=torch.int32, device=device)
        self.staged_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.staged_last_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {
            bs: BatchDecodeWithPagedKVCacheWrapper(
                self.decode_ws,
                self.store._kv_layout,  # ok: FC103
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
                backend=self._backend,  # ok: FC103
            )
            for bs in cfg.graph_batch_sizes
        }
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.eager_ws, "HND", backend="fa2")
        self.staged_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.staged_ws, "HND", backend=self._backend)
        self.extend_wrapper = BatchPrefillWithPagedKVCacheWrapper(
            get_extend_workspace(cfg.extend_workspace_bytes(), str(device)), "HND", backend="trtllm-gen"
        )
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.ragged_ws, "NHD", backend="fa2")

    # ------------------------------------------------------------ per step
    def stage_decode(self, batch: "StepBatch", bs: int) -> None:
        """Fill the graph-bound buffers for a padded decode batch and plan the bucket's wrapper."""
        real = batch.num_decode
        nnz = int(batch.decode_indptr_np[real])
        self.kv_indptr_host[: real + 1] = torch.from_numpy(batch.decode_indptr_np)
        self.kv_indptr_host[real + 1 : bs + 1] = nnz
        self.kv_last_page_len_host[:real] = torch.from_numpy(batch.decode_last_np)
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_host[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:nnz].copy_(batch.decode_slots_dev, non_blocking=True)
        w = self.graph_wrappers[bs] if bs in self.graph_wrappers else self.eager_decode
        w.plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1],
            self.kv_indices[:nnz],
            self.kv_last_page_len_host[:bs],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            data_type=self.kv_cache.dtype,
        )
        # staged layers read whole pages of the staging pool, even for padded rows
        torch.clamp(self.kv_last_page_len[:bs], min=1, out=self.kv_last_page_len[:bs])  # expect: FC104

    def plan_staged(self, batch: "StepBatch", bs: int) -> None:
        real = batch.num_decode
        self.staged_indptr_host[: real + 1] = torch.from_numpy(batch.staged_indptr_np)
        self.staged_last_host[:real] = torch.from_numpy(batch.decode_last_np)
        self.staged_wrapper.plan(  # ok: FC102
            self.staged_indptr_host[: real + 1],
            batch.staged_slots_dev,
            self.staged_last_host[:real],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            data_type=self.kv_cache.dtype,
        )

    def plan_extend(self, batch: "StepBatch") -> None:
        kv_indptr = exclusive_cumsum(batch.page_counts_dev)
        self.extend_wrapper.plan(  # expect: FC102
            batch.extend_qo_indptr_host,
            kv_indptr,
            self.extend_kv_indices,
            batch.extend_last_host,
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            causal=True,
        )

    def plan_ragged(self, qo_lens_host) -> None:
        indptr_host = torch.tensor(np.concatenate([[0], np.cumsum(qo_lens_host)]), dtype=torch.int32)
        self.ragged_wrapper.plan(indptr_host, indptr_host, self.cfg.num_qo_heads, self.cfg.num_kv_heads,  # ok: FC102
                                 self.cfg.head_dim, causal=True)

    # ------------------------------------------------------------ attention
    def forward_decode(self, q: torch.Tensor, layer: int, bs: int) -> torch.Tensor:
        w = self.graph_wrappers[bs] if self.capturing or bs in self.graph_wrappers else self.eager_decode
        return w.run(q, self.kv_cache[layer])  # ok: FC108

    def forward_staged(self, q: torch.Tensor, slot: int) -> torch.Tensor:
        return self.staged_wrapper.run(q, self.staging_kv[slot])  # expect: FC108

    def forward_extend(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        return self.extend_wrapper.run(q, self.kv_cache[layer])

    def forward_ragged(self, q, k, v) -> torch.Tensor:
        return self.ragged_wrapper.run(q, k, v)
