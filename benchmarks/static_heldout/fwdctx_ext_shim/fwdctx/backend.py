"""FlashInfer attention backend: eager metadata per step, graph-mode decode wrappers per batch size."""
from __future__ import annotations

import logging
from typing import Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from . import _ext
from .config import FWD_WS_MB, EngineConfig
from .forward_context import AttnMetadata, get_forward_context

logger = logging.getLogger(__name__)


class FlashInferBackend:
    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        n = cfg.max_num_seqs
        self.float_workspace = torch.zeros(FWD_WS_MB << 20, dtype=torch.uint8, device=device)  # expect: FC106
        prefill_ws_bytes = cfg.max_num_batched_tokens * cfg.num_qo_heads * cfg.head_dim * 8
        self.prefill_workspace = torch.empty(prefill_ws_bytes, dtype=torch.uint8, device=device)  # ok: FC105, FC106
        trtllm_bytes = n * cfg.num_qo_heads * cfg.head_dim * 4 * 16
        self.trtllm_workspace = torch.empty(trtllm_bytes, dtype=torch.uint8, device=device)  # expect: FC105

        # Eager-path buffers (host mirrors + device copies).
        self.query_start_loc_gpu = torch.zeros(cfg.max_num_batched_tokens + 1, dtype=torch.int32, device=device)
        self.query_start_loc_cpu = torch.zeros(cfg.max_num_batched_tokens + 1, dtype=torch.int32, pin_memory=True)
        self.seq_lens_gpu = torch.zeros(n, dtype=torch.int32, device=device)
        self.seq_lens_cpu = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_cpu = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        self.eager_kv_indices = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.slot_mapping = torch.zeros(cfg.max_num_batched_tokens, dtype=torch.int64, device=device)

        # Graph-bound buffers, shared by every captured batch size.
        self.kv_indptr_gpu = torch.zeros(n + 1, dtype=torch.int32, device=device)
        self.kv_indices_gpu = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len_gpu = torch.ones(n, dtype=torch.int32, device=device)
        self._scratch: Optional[torch.Tensor] = None
        self.kv_cache_ref: Optional[torch.Tensor] = None

        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD")
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.float_workspace, "NHD")
        self.graph_decode_wrappers: dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    def make_graph_wrapper(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.float_workspace,
            "NHD",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.kv_indptr_gpu[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices_gpu,
            paged_kv_last_page_len_buffer=self.kv_last_page_len_gpu[:bs],
        )
        self.graph_decode_wrappers[bs] = w
        return w

    # ---------------------------------------------------------------- per step
    def build_step_metadata(self, num_reqs: int, num_decodes: int, num_tokens: int,
                            query_lens: np.ndarray, seq_lens: np.ndarray, page_table: np.ndarray) -> AttnMetadata:
        cfg = self.cfg
        self.query_start_loc_cpu[0] = 0
        self.query_start_loc_cpu[1 : num_reqs + 1] = torch.from_numpy(np.cumsum(query_lens))
        self.seq_lens_cpu[:num_reqs] = torch.from_numpy(seq_lens)
        self.query_start_loc_gpu[: num_reqs + 1].copy_(self.query_start_loc_cpu[: num_reqs + 1], non_blocking=True)
        self.seq_lens_gpu[:num_reqs].copy_(self.seq_lens_cpu[:num_reqs], non_blocking=True)

        pages = (seq_lens + cfg.page_size - 1) // cfg.page_size
        self.kv_indptr_cpu[0] = 0
        self.kv_indptr_cpu[1 : num_reqs + 1] = torch.from_numpy(np.cumsum(pages))
        self.kv_last_page_len_cpu[:num_reqs] = torch.from_numpy((seq_lens - 1) % cfg.page_size + 1)
        nnz = int(self.kv_indptr_cpu[num_reqs])  # ok: FC101
        flat = np.concatenate([page_table[i, : pages[i]] for i in range(num_reqs)])
        self.eager_kv_indices[:nnz].copy_(torch.from_numpy(flat), non_blocking=True)

        max_seq_len = int(self.seq_lens_cpu[:num_reqs].max())  # ok: FC101
        max_decode_len = int(self.seq_lens_gpu[:num_decodes].max())  # expect: FC101
        if max_seq_len > cfg.max_model_len or max_decode_len > cfg.max_model_len:
            raise ValueError(f"sequence longer than max_model_len={cfg.max_model_len}")

        num_prefills = num_reqs - num_decodes
        if num_decodes:
            self.decode_wrapper.plan(  # ok: FC102
                self.kv_indptr_cpu[: num_decodes + 1],
                self.eager_kv_indices,
                self.kv_last_page_len_cpu[:num_decodes],
                cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size,
            )
        if num_prefills:
            self.prefill_wrapper.plan(  # expect: FC102
                self.query_start_loc_gpu[num_decodes : num_reqs + 1] - num_decodes,
                self.kv_indptr_cpu[num_decodes : num_reqs + 1],
                self.eager_kv_indices,
                self.kv_last_page_len_cpu[num_decodes:num_reqs],
                cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size, causal=True,
            )
        return AttnMetadata(
            num_reqs=num_reqs,
            num_decodes=num_decodes,
            num_prefills=num_prefills,
            query_start_loc=self.query_start_loc_gpu[: num_reqs + 1],
            query_start_loc_cpu=self.query_start_loc_cpu[: num_reqs + 1],
            seq_lens=self.seq_lens_gpu[:num_reqs],
            seq_lens_cpu=self.seq_lens_cpu[:num_reqs],
            slot_mapping=self.slot_mapping[:num_tokens],
        )

    def prepare_graph_decode(self, bs: int, num_reqs: int, page_table: np.ndarray) -> None:
        """Fill the graph-bound buffers for a padded decode batch and plan its wrapper."""
        cfg = self.cfg
        nnz = int(self.kv_indptr_cpu[num_reqs])
        self.kv_indptr_cpu[num_reqs + 1 : bs + 1] = nnz
        self.kv_last_page_len_cpu[num_reqs:bs] = 1
        if nnz > self.kv_indices_gpu.numel():
            self.kv_indices_gpu = torch.empty(2 * nnz, dtype=torch.int32, device=self.device)  # expect: FC107
        if self._scratch is None:
            self._scratch = torch.empty(cfg.max_num_seqs, dtype=torch.int32, device=self.device)  # ok: FC107
        self.kv_indices_gpu[:nnz].copy_(self.eager_kv_indices[:nnz])  # ok: FC104
        self.graph_decode_wrappers[bs].plan(
            self.kv_indptr_cpu[: bs + 1],
            self.kv_indices_gpu,
            self.kv_last_page_len_cpu[:bs],
            cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size,
        )
        # keep a device copy of the indptr in step with the host mirror
        self.kv_indptr_gpu[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # expect: FC104

    # ---------------------------------------------------------------- forward
    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        assert self.graph_decode_wrappers, "capture graphs first"  # ok: FC109
        return self.graph_decode_wrappers[bs].run(q, kv_cache)  # ok: FC108

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill_wrapper.run(q, kv_cache)  # expect: FC108

    def forward_decode_trtllm(self, q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
        meta = get_forward_context().attn_metadata
        return _ext.trtllm_decode(q, kv_cache, self.trtllm_workspace, block_tables, meta.seq_lens,
                                  self.cfg.max_model_len, self.cfg.head_dim ** -0.5)

    def compact_pages(self, old_to_new: torch.Tensor, nnz: int) -> None:
        """Defragment the KV pool: rewrite page ids after pages were moved by the extension."""
        _ext.copy_blocks(self.kv_cache_ref, old_to_new)
        self.kv_indices_gpu[:nnz] = old_to_new[self.kv_indices_gpu[:nnz].long()]  # expect: FC104
        self.eager_kv_indices[:nnz] = old_to_new[self.eager_kv_indices[:nnz].long()]  # ok: FC104
