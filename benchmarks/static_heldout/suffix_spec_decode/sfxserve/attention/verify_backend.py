"""FlashInfer attention for prompt prefill, draft verification and plain decode.

Verification attends every drafted position causally over the request's pages, so it is a
paged prefill with ``max_draft_len + 1`` query rows per request.  Each bucket of the batch
size owns one graph-mode prefill wrapper over shared, persistent index buffers; batches past
the largest bucket fall back to an eager wrapper, and contexts past ``long_decode_threshold``
without drafts take trtllm-gen's decode kernel.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    trtllm_batch_decode_with_kv_cache,
)

from sfxserve.attention.batch import PrefillBatch, VerifyBatch
from sfxserve.config import VERIFY_WORKSPACE_BYTES, SpecConfig


class VerifyAttention:
    def __init__(self, cfg: SpecConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self._kv_layout = "NHD"
        self.sm_scale = cfg.head_dim ** -0.5
        max_bs = cfg.max_batch_size

        self.prefill_workspace = torch.empty(cfg.prefill_workspace_bytes, dtype=torch.uint8, device=self.device)  # ok: FC105
        self.verify_workspace = torch.zeros(VERIFY_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.decode_workspace = torch.zeros(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=self.device)  # ok: FC106
        self.long_workspace = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=self.device)  # expect: FC105

        # persistent device buffers, bound to every graph-mode verify wrapper
        self.qo_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices = torch.zeros(cfg.max_pages, dtype=torch.int32, device=self.device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        # pinned host mirrors: what plan() reads
        self.qo_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD", backend="fa2")
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, self._kv_layout)  # ok: FC103
        self.eager_verify = BatchPrefillWithPagedKVCacheWrapper(self.decode_workspace, "NHD")
        self.verify_wrappers: Dict[int, BatchPrefillWithPagedKVCacheWrapper] = {}
        self._last_eager_key: Optional[tuple] = None
        self._long_block_tables: Optional[torch.Tensor] = None
        self._long_seq_lens: Optional[torch.Tensor] = None

    # -- set-up ------------------------------------------------------------------------

    def init_verify_graphs(self, buckets) -> None:
        for bs in buckets:
            self.verify_wrappers[bs] = BatchPrefillWithPagedKVCacheWrapper(
                self.verify_workspace,
                "NHD",
                use_cuda_graph=True,
                qo_indptr_buf=self.qo_indptr[: bs + 1],
                paged_kv_indptr_buf=self.kv_indptr[: bs + 1],
                paged_kv_indices_buf=self.kv_indices,
                paged_kv_last_page_len_buf=self.kv_last_page_len[:bs],
            )
        self.kv_last_page_len.fill_(1)  # ok: FC104

    # -- planning ----------------------------------------------------------------------

    def plan_prefill(self, batch: PrefillBatch) -> None:
        cu = [0]
        for n in batch.prompt_lens:
            cu.append(cu[-1] + n)
        # one tensor for the planner and the kernel
        qo_indptr = torch.tensor(cu, dtype=torch.int32, device=self.device)
        self.prefill_wrapper.plan(  # expect: FC102
            qo_indptr,
            batch.kv_indptr_cpu,
            batch.kv_indices,
            batch.kv_last_page_len_cpu,
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            causal=True,
            sm_scale=self.sm_scale,
        )

    def plan_eager_verify(self, batch: VerifyBatch) -> None:
        key = (batch.batch_size, batch.num_tokens, batch.max_seq_len)
        if key == self._last_eager_key and self.eager_verify._plan_info is not None:  # expect: FC103
            return
        self.eager_verify.plan(  # expect: FC102
            batch.qo_indptr_cpu,
            batch.kv_indptr_cpu,
            batch.kv_indices,
            batch.kv_last_page_len,
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            causal=True,
            sm_scale=self.sm_scale,
        )
        self._last_eager_key = key

    def plan_plain_decode(self, batch: VerifyBatch) -> None:
        if batch.max_seq_len > self.cfg.long_decode_threshold:
            self._long_seq_lens = batch.seq_lens
            return
        self.decode_wrapper.plan(  # ok: FC102
            batch.kv_indptr_cpu,
            batch.kv_indices,
            batch.kv_last_page_len_cpu,
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            sm_scale=self.sm_scale,
        )

    def prepare_bucket(self, bucket: int, batch: VerifyBatch) -> None:
        """Fill the bound buffers for one bucket and plan its wrapper (before replay)."""
        bs = batch.batch_size
        w = self.verify_wrappers[bucket]
        step = self.cfg.max_draft_len + 1
        self.qo_indptr_host[: bs + 1].copy_(batch.qo_indptr_cpu)
        self.kv_indptr_host[: bs + 1].copy_(batch.kv_indptr_cpu)
        self.kv_last_page_len_host[:bs].copy_(batch.kv_last_page_len_cpu)
        # padded rows: no pages, still max_draft_len + 1 query rows for the captured kernel
        nnz = int(self.kv_indptr_host[bs])
        for i in range(bs + 1, bucket + 1):
            self.qo_indptr_host[i] = self.qo_indptr_host[i - 1] + step
            self.kv_indptr_host[i] = nnz
        self.kv_indptr[: bucket + 1].copy_(self.kv_indptr_host[: bucket + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:nnz].copy_(batch.kv_indices[:nnz], non_blocking=True)  # ok: FC104
        w.plan(  # ok: FC102
            self.qo_indptr_host[: bucket + 1],
            self.kv_indptr_host[: bucket + 1],
            self.kv_indices,
            self.kv_last_page_len_host[:bucket],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            causal=True,
            sm_scale=self.sm_scale,
        )
        # the padded rows read one token of page 0
        self.kv_last_page_len[bs:bucket].fill_(1)  # expect: FC104

    # -- kernels -----------------------------------------------------------------------

    def prefill_attend(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill_wrapper.run(q, kv_cache)

    def verify_attend(self, q: torch.Tensor, kv_cache: torch.Tensor, bucket: int) -> torch.Tensor:
        w = self.verify_wrappers.get(bucket)
        if w is None:
            return self.eager_verify.run(q, kv_cache)  # expect: FC108
        return w.run(q, kv_cache)  # ok: FC108

    def decode_attend(self, q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
        if self._long_seq_lens is not None:
            out = trtllm_batch_decode_with_kv_cache(
                q,
                kv_cache,
                self.long_workspace,
                block_tables,
                self._long_seq_lens,
                self.cfg.max_context_len,
                self.sm_scale,
                1.0,
            )
            return out
        return self.decode_wrapper.run(q, kv_cache)

    def end_plain_decode(self) -> None:
        self._long_seq_lens = None
