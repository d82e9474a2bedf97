"""FlashInfer paged attention: eager wrappers plus one graph-mode wrapper per bucket."""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
)

from ..batch import StepInputs
from ..config import GRAPH_WORKSPACE_BYTES, EngineConfig
from .base import AttentionBackend


class FlashInferBackend(AttentionBackend):
    name = "flashinfer"

    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        super().__init__(cfg, device)
        self.workspace = torch.zeros(cfg.workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD", use_tensor_cores=True)
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")

        max_bs = cfg.max_batch_size
        # device buffers the graph-mode wrappers are bound to
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(cfg.max_num_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        # pinned host twins handed to plan()
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

        self.qo_indptr_buf: Optional[torch.Tensor] = None
        self.graph_workspace: Optional[torch.Tensor] = None
        self.graph_wrappers: Dict[int, CUDAGraphBatchDecodeWithPagedKVCacheWrapper] = {}
        # our own record of what each bucket was last planned with
        self._plan_info: Dict[int, Tuple[int, int]] = {}

    # -- eager path ------------------------------------------------------

    def init_forward_metadata(self, batch: StepInputs) -> None:
        cfg = self.cfg
        bs = batch.batch_size
        if batch.is_decode:
            self.decode_wrapper.plan(  # ok: FC102
                batch.kv_indptr_host,
                batch.kv_indices,
                batch.kv_last_page_len_host,
                cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size,
                data_type=self.kv_dtype, q_data_type=self.q_dtype,
            )
            return
        # persistent device qo_indptr: the model's last-token gather reads it too
        if self.qo_indptr_buf is None:
            self.qo_indptr_buf = torch.zeros(cfg.max_batch_size + 1, dtype=torch.int32, device=self.device)  # ok: FC107
        qo_indptr = self.qo_indptr_buf[: bs + 1]
        qo_indptr.copy_(batch.qo_indptr, non_blocking=True)
        self.prefill_wrapper.plan(  # expect: FC102
            qo_indptr,
            batch.kv_indptr_host,
            batch.kv_indices,
            batch.kv_last_page_len_host,
            cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size,
            causal=True,
            sm_scale=self.sm_scale,
            q_data_type=self.q_dtype,
            kv_data_type=self.kv_dtype,
        )

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        w = self.graph_wrappers[bs] if bs in self.graph_wrappers else self.decode_wrapper
        return w.run(q, kv_cache)  # ok: FC108

    def forward_extend(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill_wrapper.run(q, kv_cache)  # ok: FC108

    # -- CUDA graphs -----------------------------------------------------

    def init_cuda_graph_state(self, buckets: Sequence[int]) -> None:
        self.graph_workspace = torch.zeros(GRAPH_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106
        for bs in buckets:
            self.graph_wrappers[bs] = CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                self.kv_indptr[: bs + 1],
                self.kv_indices,
                self.kv_last_page_len[:bs],
                "NHD",
                use_tensor_cores=True,
            )
        self.kv_last_page_len.fill_(1)  # ok: FC104

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        cfg = self.cfg
        # one page per dummy request
        self.kv_indptr_host[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.kv_last_page_len_host[:bs] = 1
        self.kv_last_page_len[:bs].fill_(1)  # ok: FC104
        self.graph_wrappers[bs].plan(
            self.kv_indptr_host[: bs + 1], self.kv_indices[:bs], self.kv_last_page_len_host[:bs],
            cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size,
            data_type=self.kv_dtype, q_data_type=self.q_dtype,
        )

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: StepInputs) -> None:
        cfg = self.cfg
        longest = batch.seq_lens[:bs].max()
        if longest > cfg.max_seq_len:  # expect: FC101
            raise ValueError(f"a sequence in bucket {bs} exceeds max_seq_len={cfg.max_seq_len}")
        nnz = int(batch.kv_indptr_host[bs])  # ok: FC101
        self.kv_indptr_host[: bs + 1].copy_(batch.kv_indptr_host[: bs + 1])
        self.kv_last_page_len_host[:bs].copy_(batch.kv_last_page_len_host[:bs])
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_host[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:nnz].copy_(batch.kv_indices[:nnz], non_blocking=True)  # ok: FC104
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1],
            self.kv_indices[:nnz],
            self.kv_last_page_len_host[:bs],
            cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size,
            data_type=self.kv_dtype, q_data_type=self.q_dtype,
        )
        self._plan_info[bs] = (nnz, batch.num_tokens)  # ok: FC103
        # a request that just filled its page reports 0 from the scheduler
        self.kv_last_page_len[:bs].clamp_(min=1)  # expect: FC104
