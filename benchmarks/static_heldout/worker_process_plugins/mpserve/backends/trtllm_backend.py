"""trtllm-gen decode (FlashInfer's TensorRT-LLM cubins) with an FA2 fallback.

Decode goes straight to ``trtllm_batch_decode_with_kv_cache`` over a block
table; head dims the cubins do not cover fall back to an FA2 paged decode
wrapper. Prefill always uses FA2.
"""

from __future__ import annotations

from typing import Sequence

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from ..batch import StepInputs
from ..config import TRTLLM_GEN_HEAD_DIMS, EngineConfig
from .base import AttentionBackend


class TrtllmDecodeBackend(AttentionBackend):
    name = "trtllm"

    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        super().__init__(cfg, device)
        self._backend = "trtllm-gen"
        self.use_fallback = cfg.head_dim not in TRTLLM_GEN_HEAD_DIMS
        # trtllm-gen keeps its multi-CTA counters in here
        self.workspace = torch.empty(cfg.workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.fallback_ws = torch.empty(cfg.workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.fallback_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.fallback_ws, "HND", backend="fa2")
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.fallback_ws, "HND", backend="fa2")

        self.block_tables = torch.zeros(
            cfg.max_batch_size, cfg.max_pages_per_seq, dtype=torch.int32, device=device
        )
        self.seq_lens = torch.zeros(cfg.max_batch_size, dtype=torch.int32, device=device)
        self.max_len_cur = cfg.max_seq_len

    def describe(self) -> str:
        return f"{self.name}:{self._backend}" + ("+fa2" if self.use_fallback else "")  # ok: FC103

    def _fill_block_tables(self, batch: StepInputs, bs: int) -> None:
        indptr = batch.kv_indptr_host.numpy()
        for i in range(bs):
            start, end = int(indptr[i]), int(indptr[i + 1])
            self.block_tables[i, : end - start] = batch.kv_indices[start:end]

    def _plan_fallback(self, batch: StepInputs) -> None:
        cfg = self.cfg
        self.fallback_wrapper.plan(
            batch.kv_indptr_host, batch.kv_indices, batch.kv_last_page_len_host,
            cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size,
            data_type=self.kv_dtype, q_data_type=self.q_dtype,
        )

    # -- eager path ------------------------------------------------------

    def init_forward_metadata(self, batch: StepInputs) -> None:
        cfg = self.cfg
        bs = batch.batch_size
        self._fill_block_tables(batch, bs)
        self.seq_lens[:bs].copy_(batch.seq_lens, non_blocking=True)
        self.max_len_cur = int(batch.seq_lens_host.max())
        if batch.is_decode:
            if self.use_fallback:
                self._plan_fallback(batch)
            return
        self.prefill_wrapper.plan(
            batch.qo_indptr_host, batch.kv_indptr_host, batch.kv_indices, batch.kv_last_page_len_host,
            cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size,
            causal=True,
            sm_scale=self.sm_scale,
            q_data_type=self.q_dtype,
            kv_data_type=self.kv_dtype,
        )

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        if self.use_fallback:
            return self.fallback_wrapper.run(q, kv_cache)  # expect: FC108
        return trtllm_batch_decode_with_kv_cache(
            query=q,
            kv_cache=kv_cache,
            workspace_buffer=self.workspace,
            block_tables=self.block_tables[:bs],
            seq_lens=self.seq_lens[:bs],
            max_seq_len=self.cfg.max_seq_len,
            bmm1_scale=self.sm_scale,
            bmm2_scale=1.0,
        )

    def forward_extend(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill_wrapper.run(q, kv_cache)

    # -- CUDA graphs -----------------------------------------------------

    def init_cuda_graph_state(self, buckets: Sequence[int]) -> None:
        self.block_tables.zero_()
        self.seq_lens.zero_()

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        self.seq_lens[:bs].fill_(1)
        self.block_tables[:bs].zero_()
        self.max_len_cur = self.seq_lens[:bs].max().item()  # expect: FC101

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: StepInputs) -> None:
        cfg = self.cfg
        self.block_tables = torch.zeros(bs, cfg.max_pages_per_seq, dtype=torch.int32, device=self.device)  # expect: FC107
        self._fill_block_tables(batch, bs)
        self.seq_lens[:bs].copy_(batch.seq_lens[:bs], non_blocking=True)
        if self.use_fallback:
            self.fallback_wrapper.plan(  # expect: FC102
                batch.kv_indptr_host[: bs + 1],
                batch.kv_indices,
                batch.kv_last_page_len,
                cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size,
                data_type=self.kv_dtype, q_data_type=self.q_dtype,
            )
