"""FlashInfer decode attention: graph-mode wrappers per bucket, eager fallbacks."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from penaltyserve.config import _WS_MIB, EngineConfig

logger = logging.getLogger(__name__)

# The bucket wrappers keep their own view of the last-page lengths; we check
# its capacity against the bucket before planning.
_LAST_PAGE_ATTR = "_paged_kv_last_page_len_buf"


@dataclass
class DecodeInputs:
    """Page table of one eager decode step."""

    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    batch_size: int


@dataclass
class GraphView:
    """The bucket's slice of the graph-bound page-table buffers."""

    indptr: torch.Tensor
    indices: torch.Tensor
    last_page_len: torch.Tensor


class DecodeAttnBackend:
    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        dev = torch.device(cfg.device)
        self.device = dev
        ws_bytes = cfg.decode_workspace_bytes()
        self.decode_workspace = torch.zeros(ws_bytes, dtype=torch.uint8, device=dev)  # ok: FC106
        self.eager_workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=dev)  # ok: FC105
        self.prefill_workspace = torch.zeros(_WS_MIB["prefill"] << 20, dtype=torch.uint8, device=dev)  # expect: FC106

        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.eager_workspace, "NHD", backend="fa2")
        # GQA groups of 7: the tensor-core kernel wins from 64 rows up
        self.tc_decode = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, "NHD", use_tensor_cores=True)
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD")
        self.trtllm_ws: Optional[torch.Tensor] = None
        if cfg.use_trtllm_decode:
            self.trtllm_ws = torch.empty(ws_bytes, dtype=torch.uint8, device=dev)  # expect: FC105

        max_bs = cfg.max_batch_size
        # graph-bound page table (bound to every bucket wrapper by init_graph_wrappers)
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.kv_indices_buf = torch.zeros(cfg.max_num_pages, dtype=torch.int32, device=dev)
        self.kv_last_page_len_buf = torch.ones(max_bs, dtype=torch.int32, device=dev)
        # pinned host mirrors handed to plan()
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.qo_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        # device copies for the eager and trtllm-gen paths
        self.kv_indices_dev = torch.zeros(cfg.max_num_pages, dtype=torch.int32, device=dev)
        self.kv_last_page_len_dev = torch.ones(max_bs, dtype=torch.int32, device=dev)
        self.seq_lens_dev = torch.zeros(max_bs, dtype=torch.int32, device=dev)
        self.block_tables = torch.zeros(max_bs, cfg.max_pages_per_req, dtype=torch.int32, device=dev)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.sm_scale = cfg.head_dim ** -0.5

    # ------------------------------------------------------------------ set-up
    def init_graph_wrappers(self) -> None:
        for bucket in self.cfg.graph_buckets:
            self.graph_wrappers[bucket] = BatchDecodeWithPagedKVCacheWrapper(
                self.decode_workspace,
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bucket + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.kv_last_page_len_buf[:bucket],
            )
        self.kv_indptr_buf.zero_()  # ok: FC104

    def graph_view(self, bucket: int) -> GraphView:
        return GraphView(
            indptr=self.kv_indptr_buf[: bucket + 1],
            indices=self.kv_indices_buf,
            last_page_len=self.kv_last_page_len_buf[:bucket],
        )

    def _wrapper_for(self, bucket: int) -> BatchDecodeWithPagedKVCacheWrapper:
        if bucket >= self.cfg.tensor_core_bucket:
            return self.tc_decode
        return self.graph_wrappers[bucket]

    def _plan_kwargs(self) -> dict:
        cfg = self.cfg
        return dict(
            num_qo_heads=cfg.num_qo_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            page_size=cfg.page_size,
            q_data_type=torch.bfloat16,
            sm_scale=self.sm_scale,
        )

    # --------------------------------------------------------- replay preparation
    def load_replay_inputs(
        self,
        bucket: int,
        bs: int,
        indptr_np: np.ndarray,
        indices_np: np.ndarray,
        last_np: np.ndarray,
    ) -> None:
        w = self._wrapper_for(bucket)
        if bucket < self.cfg.tensor_core_bucket and getattr(w, _LAST_PAGE_ATTR).numel() < bucket:  # expect: FC103
            raise RuntimeError(f"bucket {bucket} wrapper was built for a smaller batch")
        nnz = int(indptr_np[bs])  # ok: FC101
        self.kv_indptr_cpu[: bs + 1] = torch.from_numpy(indptr_np[: bs + 1])
        self.kv_indptr_cpu[bs + 1 : bucket + 1] = nnz
        self.kv_last_page_len_cpu[:bs] = torch.from_numpy(last_np[:bs])
        self.kv_last_page_len_cpu[bs:bucket] = 1
        staged = torch.from_numpy(indices_np[:nnz]).pin_memory()
        self.kv_indices_buf[:nnz].copy_(staged, non_blocking=True)  # ok: FC104
        w.plan(  # ok: FC102
            self.kv_indptr_cpu[: bucket + 1],
            self.kv_indices_buf[:nnz],
            self.kv_last_page_len_cpu[:bucket],
            **self._plan_kwargs(),
        )

    def warm_plan(self, bucket: int) -> None:
        """Plan a bucket on one page per row so that the warm-up run has a valid plan."""
        self.kv_indptr_cpu[: bucket + 1] = torch.arange(bucket + 1, dtype=torch.int32)
        self.kv_last_page_len_cpu[:bucket] = 1
        w = self._wrapper_for(bucket)
        w.plan(
            self.kv_indptr_cpu[: bucket + 1],
            self.kv_indices_buf[:bucket],
            self.kv_last_page_len_cpu[:bucket],
            **self._plan_kwargs(),
        )

    # ----------------------------------------------------------------- eager
    def plan_eager_decode(self, inp: DecodeInputs) -> None:
        self.eager_decode.plan(  # expect: FC102
            inp.kv_indptr,
            inp.kv_indices,
            inp.kv_last_page_len,
            **self._plan_kwargs(),
        )

    def plan_prefill(self, qo_indptr_cpu: torch.Tensor, kv_indptr_cpu: torch.Tensor, last_cpu: torch.Tensor) -> None:
        nnz = int(kv_indptr_cpu[-1])
        cfg = self.cfg
        self.prefill.plan(  # ok: FC102
            qo_indptr_cpu,
            kv_indptr_cpu,
            self.kv_indices_dev[:nnz],
            last_cpu,
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            causal=True,
            q_data_type=torch.bfloat16,
        )

    # --------------------------------------------------------------- forward
    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bucket: int) -> torch.Tensor:
        """Decode attention inside the captured graph of ``bucket``."""
        if bucket >= self.cfg.tensor_core_bucket:
            return self.tc_decode.run(q, kv_cache)  # expect: FC108
        return self.graph_wrappers[bucket].run(q, kv_cache)  # ok: FC108

    def forward_eager_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int, max_seq_len: int) -> torch.Tensor:
        if self.trtllm_ws is not None:
            return trtllm_batch_decode_with_kv_cache(
                q,
                kv_cache,
                self.trtllm_ws,
                self.block_tables[:bs],
                self.seq_lens_dev[:bs],
                max_seq_len,
                bmm1_scale=self.sm_scale,
                bmm2_scale=1.0,
            )
        return self.eager_decode.run(q, kv_cache)

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill.run(q, kv_cache)
