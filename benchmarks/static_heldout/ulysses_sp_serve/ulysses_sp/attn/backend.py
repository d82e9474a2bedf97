"""FlashInfer attention on the local head shard of the full sequence."""
from __future__ import annotations

import logging

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    merge_state,
)

from ulysses_sp.batch import DecodeInputs, ForwardBatch, UlyssesPrefillMeta
from ulysses_sp.config import DECODE_GRAPH_WORKSPACE_BYTES, SPConfig

logger = logging.getLogger(__name__)


class UlyssesFlashInferBackend:
    def __init__(self, cfg: SPConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self._kv_layout = "NHD"
        self.num_qo_heads = cfg.local_heads
        self.num_kv_heads = cfg.local_kv_heads
        self.head_dim = cfg.head_dim

        # split-k partials for the longest prefill this rank plans: tokens x local heads x head_dim (fp32)
        prefill_ws_bytes = cfg.max_prefill_tokens * cfg.local_heads * cfg.head_dim * 4 + (16 << 20)
        self.prefill_workspace = torch.zeros(prefill_ws_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, self._kv_layout)
        self.prefix_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout)

        # short chunk continuations (and the extend graphs) attend over all pages with a paged prefill
        ext_ws_bytes = cfg.max_extend_tokens * cfg.max_batch_size * cfg.local_heads * cfg.head_dim * 4
        self.extend_workspace = torch.empty(ext_ws_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.extend_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.extend_workspace, self._kv_layout)

        # eager decode for batches above the largest captured bucket; trtllm-gen on Blackwell
        decode_backend = "trtllm-gen" if cfg.sm_version >= 100 else "fa2"
        dec_ws_bytes = cfg.max_batch_size * cfg.local_heads * cfg.head_dim * 4 * 64 + (32 << 20)
        self.decode_workspace = torch.empty(dec_ws_bytes, dtype=torch.uint8, device=device)  # expect: FC105
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.decode_workspace, self._kv_layout, backend=decode_backend
        )
        self.graph_wrappers: dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    # ------------------------------------------------------------------ graph state
    def init_cuda_graph_state(self) -> None:
        cfg = self.cfg
        max_bs = max(cfg.graph_buckets)
        self.graph_workspace = torch.zeros(DECODE_GRAPH_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices = torch.zeros(cfg.max_pages, dtype=torch.int32, device=self.device)
        self.kv_last_page_len = torch.empty(max_bs, dtype=torch.int32, device=self.device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        for bs in cfg.graph_buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                self._kv_layout,
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )
        self.kv_last_page_len.fill_(1)  # ok: FC104
        self.check_graph_wrappers()

    def check_graph_wrappers(self) -> None:
        for bs, w in self.graph_wrappers.items():
            if not getattr(w, "_use_cuda_graph"):  # expect: FC103
                raise RuntimeError(f"decode wrapper for bucket {bs} was built outside graph mode")

    def describe(self) -> str:
        return f"layout={self._kv_layout} heads={self.num_qo_heads}/{self.num_kv_heads}"  # ok: FC103

    def capture_forward_batch(self, bs: int, input_ids, positions, batch_indices) -> ForwardBatch:
        # dummy rows: one page each, page 0
        self.kv_indptr_cpu[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.kv_last_page_len_cpu[:bs] = 1
        w = self.graph_wrappers[bs]
        w.plan(
            self.kv_indptr_cpu[: bs + 1],
            self.kv_indices,
            self.kv_last_page_len_cpu[:bs],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.cfg.page_size,
        )
        return ForwardBatch(
            batch_size=bs,
            input_ids=input_ids[:bs],
            positions=positions[:bs],
            batch_indices=batch_indices[:bs],
            kv_indptr=self.kv_indptr[: bs + 1],
            kv_indices=self.kv_indices,
            kv_last_page_len=self.kv_last_page_len[:bs],
            decode_wrapper=w,
        )

    # ------------------------------------------------------------------ planning
    def plan_prefill(self, meta: UlyssesPrefillMeta) -> None:
        self.ragged_wrapper.plan(  # ok: FC102
            meta.qo_indptr_cpu,
            meta.kv_indptr_cpu,
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            causal=True,
        )
        if meta.has_prefix:
            self.prefix_wrapper.plan(  # expect: FC102
                meta.qo_indptr_cpu,
                meta.prefix_kv_indptr,
                meta.prefix_kv_indices,
                meta.prefix_last_page_len_cpu,
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                self.cfg.page_size,
                causal=False,
            )

    def plan_decode(self, dec: DecodeInputs) -> None:
        """Eager decode for batches above the largest captured bucket."""
        self.decode_wrapper.plan(  # expect: FC102
            dec.kv_indptr_cpu,
            dec.kv_indices,
            dec.last_page_len,
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.cfg.page_size,
        )

    def plan_extend(self, qo_indptr_cpu: torch.Tensor, dec: DecodeInputs) -> None:
        self.extend_wrapper.plan(
            qo_indptr_cpu,
            dec.kv_indptr_cpu,
            dec.kv_indices,
            dec.last_page_len_cpu,
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.cfg.page_size,
            causal=True,
        )

    def prepare_decode_replay(self, bs: int, dec: DecodeInputs) -> None:
        n = dec.num_reqs
        nnz = dec.num_pages
        if dec.max_seq_len > self.cfg.max_context_len:
            raise ValueError(f"a decode row exceeds max_context_len={self.cfg.max_context_len}")
        if nnz > self.kv_indices.numel():
            self.kv_indices = torch.zeros(2 * nnz, dtype=torch.int32, device=self.device)  # expect: FC107
        self.kv_indices[:nnz].copy_(dec.kv_indices, non_blocking=True)  # ok: FC104
        self.kv_indptr_cpu[: n + 1].copy_(dec.kv_indptr_cpu)
        self.kv_indptr_cpu[n + 1 : bs + 1] = nnz
        self.kv_last_page_len_cpu[:n].copy_(dec.last_page_len_cpu)
        w = self.graph_wrappers[bs]
        w.plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1],
            self.kv_indices,
            self.kv_last_page_len_cpu[:bs],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.cfg.page_size,
        )
        # padded rows read one token of page 0
        self.kv_last_page_len[n:bs].fill_(1)  # expect: FC104

    # ------------------------------------------------------------------ attention
    def forward_prefill(self, q, k, v, kv_cache, meta: UlyssesPrefillMeta) -> torch.Tensor:
        o, lse = self.ragged_wrapper.run_return_lse(q, k, v)
        if meta.has_prefix:
            o_p, lse_p = self.prefix_wrapper.run_return_lse(q, kv_cache)
            o, lse = merge_state(o, lse, o_p, lse_p)
        return o

    def forward_extend(self, q: torch.Tensor, kv_cache: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        return self.extend_wrapper.run(q, kv_cache)  # expect: FC108

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        return fb.decode_wrapper.run(q, kv_cache)  # ok: FC108
