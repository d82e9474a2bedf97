"""FlashInfer attention for differential heads.

Both branches of a layer share the page table: the graph-mode decode wrappers of a bucket (one per branch) are bound
to the same ``kv_indptr`` / ``kv_indices`` / ``kv_last_page_len`` buffers and planned together.
"""

from __future__ import annotations

import logging
from typing import Dict, Tuple

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)

from diffserve.attention.metadata import DiffForwardBatch
from diffserve.config import BRANCHES, PREFILL_WORKSPACE_BYTES, DiffConfig
from diffserve.kv.pair_pool import PairedKVPool

logger = logging.getLogger(__name__)


def _is_blackwell(device: torch.device) -> bool:
    major, _ = torch.cuda.get_device_capability(device)
    return major >= 10


class DiffAttnBackend:
    def __init__(self, cfg: DiffConfig, pool: PairedKVPool, device: torch.device):
        self.cfg = cfg
        self.pool = pool
        self.device = device
        self._kv_layout = "NHD"
        self.q_dtype = getattr(torch, cfg.dtype)
        self.max_graph_bs = cfg.max_graph_bs

        self.graph_ws = torch.empty(cfg.graph_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.eager_ws = torch.empty(cfg.decode_workspace_bytes, dtype=torch.uint8, device=device)  # expect: FC105
        self.prefill_ws = torch.zeros(PREFILL_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.ragged_ws = torch.zeros(cfg.ragged_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106

        decode_backend = "trtllm-gen" if _is_blackwell(device) else "fa2"
        self.eager_branches: Dict[str, BatchDecodeWithPagedKVCacheWrapper] = {
            b: BatchDecodeWithPagedKVCacheWrapper(self.eager_ws, self._kv_layout, backend=decode_backend)
            for b in BRANCHES
        }
        # Anchor layers are plain softmax attention; they borrow the eager decode workspace.
        shared_ws = self.eager_branches["pos"]._float_workspace_buffer  # expect: FC103
        self.anchor_decode = BatchDecodeWithPagedKVCacheWrapper(shared_ws, self._kv_layout)
        self.paged_prefill = {b: BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, self._kv_layout) for b in BRANCHES}
        self.ragged = {b: BatchPrefillWithRaggedKVCacheWrapper(self.ragged_ws, self._kv_layout) for b in BRANCHES}

        max_pages = cfg.max_pages_per_req
        self.eager_kv_indptr = torch.zeros(cfg.max_batch_size + 1, dtype=torch.int32, device=device)
        self.eager_kv_last_page = torch.ones(cfg.max_batch_size, dtype=torch.int32, device=device)
        self.graph_branches: Dict[int, Dict[str, BatchDecodeWithPagedKVCacheWrapper]] = {}
        self.init_graph_buffers(self.max_graph_bs, max_pages)

    # ------------------------------------------------------------------ set-up
    def init_graph_buffers(self, max_bs: int, max_pages: int) -> None:
        dev = self.device
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.kv_indices_buf = torch.zeros(max_bs * max_pages, dtype=torch.int32, device=dev)
        self.kv_last_page_buf = torch.empty(max_bs, dtype=torch.int32, device=dev)
        self.kv_last_page_buf.fill_(1)  # ok: FC104
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        for bs in self.cfg.graph_buckets:
            self.graph_branches[bs] = {
                b: BatchDecodeWithPagedKVCacheWrapper(
                    self.graph_ws,
                    self._kv_layout,
                    use_cuda_graph=True,
                    paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                    paged_kv_indices_buffer=self.kv_indices_buf,
                    paged_kv_last_page_len_buffer=self.kv_last_page_buf[:bs],
                )
                for b in BRANCHES
            }

    def _plan_kwargs(self) -> dict:
        return dict(q_data_type=self.q_dtype, kv_data_type=self.q_dtype)

    # ------------------------------------------------------------------ per step
    def prepare_graph_step(self, fb: DiffForwardBatch, bs: int) -> None:
        """Fill the bucket's bound buffers from the step's host page table and plan both branches."""
        assert bs in self.graph_branches, f"no captured bucket {bs}"  # expect: FC109
        raw = fb.batch_size
        if raw > bs:
            raise ValueError(f"batch of {raw} does not fit bucket {bs} (seq_lens={fb.seq_lens})")  # ok: FC101
        longest = int(fb.seq_lens_cpu[:raw].max())  # ok: FC101
        if longest > self.cfg.max_context_len:
            raise ValueError(f"context {longest} exceeds {self.cfg.max_context_len}")
        nnz = int(fb.kv_indptr_cpu[raw])
        self.kv_indptr_cpu[: raw + 1].copy_(fb.kv_indptr_cpu[: raw + 1])
        self.kv_indptr_cpu[raw + 1 : bs + 1].fill_(nnz)
        self.kv_last_page_cpu[:raw].copy_(fb.kv_last_page_cpu[:raw])
        self.kv_indptr_buf[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices_buf[:nnz].copy_(fb.kv_indices[:nnz], non_blocking=True)

        cfg = self.cfg
        self.anchor_decode.plan(
            self.kv_indptr_cpu[: bs + 1], self.kv_indices_buf[:nnz], self.kv_last_page_cpu[:bs],
            2 * cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size, **self._plan_kwargs(),
        )
        for branch, w in self.graph_branches[bs].items():
            w.plan(  # ok: FC102
                self.kv_indptr_cpu[: bs + 1],
                self.kv_indices_buf[:nnz],
                self.kv_last_page_cpu[:bs],
                cfg.num_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                cfg.page_size,
                **self._plan_kwargs(),
            )
        # padded rows read one token of the null page
        self.kv_last_page_cpu[raw:bs].fill_(1)  # ok: FC104
        self.kv_last_page_buf[raw:bs].fill_(1)  # expect: FC104
        fb.bucket = bs
        fb.branch_wrappers = self.graph_branches[bs]

    def plan_eager_decode(self, fb: DiffForwardBatch) -> None:
        """Decode batches above the largest bucket run eagerly."""
        cfg = self.cfg
        bs = fb.batch_size
        nnz = int(fb.kv_indptr_cpu[bs])
        self.eager_kv_indptr[: bs + 1].copy_(fb.kv_indptr_cpu[: bs + 1], non_blocking=True)
        self.eager_kv_last_page[:bs].copy_(fb.kv_last_page_cpu[:bs], non_blocking=True)
        # split-kv only pays for itself on long contexts; short batches keep one CTA per request
        short = int(fb.seq_lens.max()) < 2048  # expect: FC101
        for w in self.eager_branches.values():
            w.plan(  # expect: FC102
                self.eager_kv_indptr[: bs + 1],
                fb.kv_indices[:nnz],
                self.eager_kv_last_page[:bs],
                cfg.num_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                cfg.page_size,
                disable_split_kv=short,
                **self._plan_kwargs(),
            )
        self.anchor_decode.plan(
            fb.kv_indptr_cpu[: bs + 1], fb.kv_indices[:nnz], fb.kv_last_page_cpu[:bs],
            2 * cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size, **self._plan_kwargs(),
        )
        fb.bucket = None
        fb.branch_wrappers = self.eager_branches

    def plan_prefill(self, fb: DiffForwardBatch) -> None:
        cfg = self.cfg
        bs = fb.batch_size
        nnz = int(fb.kv_indptr_cpu[bs])
        if not fb.prefix_cached:
            for w in self.ragged.values():
                w.plan(  # ok: FC102
                    fb.qo_indptr_cpu,
                    fb.qo_indptr_cpu,
                    cfg.num_heads,
                    cfg.num_kv_heads,
                    cfg.head_dim,
                    causal=True,
                    q_data_type=self.q_dtype,
                )
            return
        for w in self.paged_prefill.values():
            w.plan(  # expect: FC102
                fb.qo_indptr,
                fb.kv_indptr_cpu,
                fb.kv_indices[:nnz],
                fb.kv_last_page_cpu,
                cfg.num_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                cfg.page_size,
                causal=True,
                q_data_type=self.q_dtype,
            )

    # ------------------------------------------------------------------ kernels
    def forward_decode(self, q_pos: torch.Tensor, q_neg: torch.Tensor, layer_id: int, fb: DiffForwardBatch):
        cache_pos, cache_neg = self.pool.layer_caches(layer_id)
        wrappers = fb.branch_wrappers
        a_pos = wrappers["pos"].run(q_pos, cache_pos)  # ok: FC108
        a_neg = wrappers["neg"].run(q_neg, cache_neg)
        return a_pos, a_neg

    def forward_anchor(self, q: torch.Tensor, layer_id: int, fb: DiffForwardBatch) -> torch.Tensor:
        # anchor layers keep their keys in the "pos" cache; the "neg" keys of those layers are unused
        cache_pos, _ = self.pool.layer_caches(layer_id)
        return self.anchor_decode.run(q, cache_pos)  # expect: FC108

    def forward_extend(self, q_pos, q_neg, k_pos, k_neg, v, layer_id: int, fb: DiffForwardBatch):
        if not fb.prefix_cached:
            a_pos = self.ragged["pos"].run(q_pos, k_pos, v)
            a_neg = self.ragged["neg"].run(q_neg, k_neg, v)
            return a_pos, a_neg
        cache_pos, cache_neg = self.pool.layer_caches(layer_id)
        return self.paged_prefill["pos"].run(q_pos, cache_pos), self.paged_prefill["neg"].run(q_neg, cache_neg)
