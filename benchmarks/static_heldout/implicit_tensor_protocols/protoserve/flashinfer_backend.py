"""FlashInfer attention backend: paged KV pool, per-step planning, CUDA-graph decode wrappers."""

import math
from typing import Dict, Optional, Tuple

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from protoserve.config import DECODE_WORKSPACE_BYTES, EngineConfig
from protoserve.forward_batch import ForwardBatch


class PagedKVPool:
    """One [num_pages, 2, page_size, kv_heads, head_dim] cache per layer (NHD layout)."""

    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.page_size = cfg.page_size
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.kv = [
            torch.zeros(
                cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim,
                dtype=cfg.kv_dtype, device=device,
            )
            for _ in range(cfg.num_layers)
        ]

    def store(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cache = self.kv[layer_id]
        page, off = loc // self.page_size, loc % self.page_size
        cache[page, 0, off] = k.view(-1, self.num_kv_heads, self.head_dim).to(cache.dtype)
        cache[page, 1, off] = v.view(-1, self.num_kv_heads, self.head_dim).to(cache.dtype)
        return cache


class FlashInferBackend:
    def __init__(self, cfg: EngineConfig, kv_pool: PagedKVPool, page_table: np.ndarray, device: torch.device):
        self.device = device
        self.kv_pool = kv_pool
        self.page_table_np = page_table  # [max_num_reqs, max_pages_per_req], owned by the model runner
        self.page_size = cfg.page_size
        self.num_qo_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.dtype = cfg.dtype
        self.kv_dtype = cfg.kv_dtype
        self.sliding_window = cfg.sliding_window
        self.max_pages_per_req = cfg.max_pages_per_req
        self.max_context_len = cfg.max_context_len
        self.max_extend_tokens = cfg.chunked_prefill_size
        self.use_trtllm_decode = cfg.decode_backend == "trtllm-gen"
        self.sm_scale = 1.0 / math.sqrt(cfg.head_dim)

        self.workspace_buffer = torch.empty(DECODE_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.prefill_workspace = torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.trtllm_workspace = None
        if self.use_trtllm_decode:
            self.trtllm_workspace = torch.empty(cfg.trtllm_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105

        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.workspace_buffer, "NHD")
        self.swa_decode_wrapper = (
            BatchDecodeWithPagedKVCacheWrapper(self.workspace_buffer, "NHD") if cfg.sliding_window else None
        )
        self.prefill_wrapper_ragged = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, "NHD")
        self.prefill_wrapper_paged = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD")
        self.use_ragged = False

        max_reqs = cfg.max_num_reqs
        max_pages = max_reqs * self.max_pages_per_req
        # Host mirrors the planner reads; numpy views are filled in place every step.
        self.kv_indptr_cpu = torch.zeros(max_reqs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_reqs, dtype=torch.int32, pin_memory=True)
        self.qo_indptr_cpu = torch.zeros(max_reqs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices_cpu = torch.zeros(max_pages, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_np = self.kv_indptr_cpu.numpy()
        self.kv_last_page_len_np = self.kv_last_page_len_cpu.numpy()
        self.qo_indptr_np = self.qo_indptr_cpu.numpy()
        self.kv_indices_np = self.kv_indices_cpu.numpy()
        self.kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=device)

        self.block_tables_cpu = torch.zeros(max_reqs, self.max_pages_per_req, dtype=torch.int32, pin_memory=True)
        self.block_tables_np = self.block_tables_cpu.numpy()
        self.block_tables = torch.zeros(max_reqs, self.max_pages_per_req, dtype=torch.int32, device=device)
        self.decode_max_seq_len = cfg.max_context_len

        self.graph_decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        # What was last planned, per wrapper: (batch size, number of pages).
        self._plan_info: Dict[str, Tuple[int, int]] = {}
        self.graph_workspace_bytes = cfg.graph_workspace_bytes()

    # ------------------------------------------------------------------ host-side page layout

    def _page_layout(self, slots_np: np.ndarray, seq_lens_np: np.ndarray) -> int:
        """Fill kv_indptr / kv_indices / kv_last_page_len host mirrors; return the number of pages."""
        bs = len(seq_lens_np)
        pages = (seq_lens_np + self.page_size - 1) // self.page_size
        self.kv_indptr_np[0] = 0
        self.kv_indptr_np[1 : bs + 1] = np.cumsum(pages)
        self.kv_last_page_len_np[:bs] = seq_lens_np - (pages - 1) * self.page_size
        for i in range(bs):
            start, end = self.kv_indptr_np[i], self.kv_indptr_np[i + 1]
            self.kv_indices_np[start:end] = self.page_table_np[slots_np[i], : end - start]
        return int(self.kv_indptr_np[bs])

    def _fill_block_tables(self, slots_np: np.ndarray, bs: int) -> None:
        self.block_tables_np[:bs] = self.page_table_np[slots_np]
        self.block_tables[:bs].copy_(self.block_tables_cpu[:bs], non_blocking=True)

    def _plan_decode(self, wrapper, indices: torch.Tensor, bs: int, window_left: int = -1) -> None:
        wrapper.plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1],
            indices,
            self.kv_last_page_len_cpu[:bs],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            window_left=window_left,
            q_data_type=self.dtype,
            kv_data_type=self.kv_dtype,
        )

    def _plan_decode_all(self, wrapper, indices: torch.Tensor, bs: int) -> None:
        """Plan the full-attention decode wrapper and, if the model has one, the sliding-window one."""
        self._plan_decode(wrapper, indices, bs)
        if self.swa_decode_wrapper is not None:
            self._plan_decode(self.swa_decode_wrapper, indices, bs, self.sliding_window - 1)

    # ------------------------------------------------------------------ eager steps

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        if fb.forward_mode.is_decode():
            self._init_decode_metadata(fb)
        else:
            self._init_extend_metadata(fb)

    def _init_decode_metadata(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        seq_lens_np = fb.seq_lens_cpu[:bs].numpy()  # ok: FC101
        slots_np = fb.req_pool_indices_cpu[:bs].numpy()
        nnz = self._page_layout(slots_np, seq_lens_np)
        self.kv_indices[:nnz].copy_(self.kv_indices_cpu[:nnz], non_blocking=True)
        self._plan_info["decode"] = (bs, nnz)  # ok: FC103

        if self.use_trtllm_decode:
            # The kernel wants the longest sequence rounded up to whole pages.
            self.decode_max_seq_len = math.ceil(fb.seq_lens.max() / self.page_size) * self.page_size  # expect: FC101
            self._fill_block_tables(slots_np, bs)
            return

        self._plan_decode_all(self.decode_wrapper, self.kv_indices[:nnz], bs)

    def _init_extend_metadata(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        num_prefixed = (fb.extend_prefix_lens > 0).sum()
        if num_prefixed == 0:  # expect: FC101
            # Fresh prompts only: attend over the new tokens, no paged prefix.
            qo_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
            torch.cumsum(fb.extend_seq_lens, dim=0, dtype=torch.int32, out=qo_indptr[1:])
            self.prefill_wrapper_ragged.plan(  # expect: FC102
                qo_indptr, qo_indptr, self.num_qo_heads, self.num_kv_heads, self.head_dim,
                causal=True, sm_scale=self.sm_scale, q_data_type=self.dtype,
            )
            self.use_ragged = True
            return

        total = sum(fb.extend_seq_lens_cpu)
        if total > self.max_extend_tokens:
            raise ValueError(f"extend batch of {total} tokens exceeds chunked_prefill_size={self.max_extend_tokens}")
        self.qo_indptr_np[0] = 0
        self.qo_indptr_np[1 : bs + 1] = np.cumsum(fb.extend_seq_lens_cpu)
        nnz = self._page_layout(fb.req_pool_indices_cpu[:bs].numpy(), fb.seq_lens_cpu[:bs].numpy())
        self.kv_indices[:nnz].copy_(self.kv_indices_cpu[:nnz], non_blocking=True)
        self.prefill_wrapper_paged.plan(  # ok: FC102
            self.qo_indptr_cpu[: bs + 1],
            self.kv_indptr_cpu[: bs + 1],
            self.kv_indices[:nnz],
            self.kv_last_page_len_cpu[:bs],
            self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size,
            causal=True, sm_scale=self.sm_scale, q_data_type=self.dtype, kv_data_type=self.kv_dtype,
        )
        self._plan_info["extend"] = (bs, nnz)
        self.use_ragged = False

    # ------------------------------------------------------------------ CUDA graphs

    def init_cuda_graph_state(self, max_bs: int) -> None:
        self.graph_workspace = torch.empty(self.graph_workspace_bytes, dtype=torch.uint8, device=self.device)  # ok: FC105
        self.cuda_graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.cuda_graph_kv_indices = torch.zeros(max_bs * self.max_pages_per_req, dtype=torch.int32, device=self.device)
        self.cuda_graph_kv_last_page_len = torch.empty(max_bs, dtype=torch.int32, device=self.device)
        self.cuda_graph_kv_last_page_len.fill_(1)  # ok: FC104

    def init_forward_metadata_capture_cuda_graph(
        self, bs: int, req_pool_indices_cpu: torch.Tensor, seq_lens_cpu: torch.Tensor
    ) -> None:
        slots_np = req_pool_indices_cpu[:bs].numpy()
        nnz = self._page_layout(slots_np, seq_lens_cpu[:bs].numpy())
        if self.use_trtllm_decode:
            # A captured trtllm-gen launch keeps its max_seq_len, so capture with the context limit.
            self.decode_max_seq_len = self.max_context_len
            self._fill_block_tables(slots_np, bs)
            return
        self.cuda_graph_kv_indices[:nnz].copy_(self.kv_indices_cpu[:nnz], non_blocking=True)
        wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace,
            "NHD",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.cuda_graph_kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.cuda_graph_kv_indices,
            paged_kv_last_page_len_buffer=self.cuda_graph_kv_last_page_len[:bs],
            backend="fa2",
        )
        self._plan_decode_all(wrapper, self.cuda_graph_kv_indices[:nnz], bs)
        self.graph_decode_wrappers[bs] = wrapper

    def init_forward_metadata_replay_cuda_graph(
        self, bs: int, raw_bs: int, req_pool_indices_cpu: torch.Tensor, seq_lens_cpu: torch.Tensor
    ) -> None:
        slots_np = req_pool_indices_cpu[:bs].numpy()
        nnz = self._page_layout(slots_np, seq_lens_cpu[:bs].numpy())
        max_len = int(seq_lens_cpu[:bs].max())  # ok: FC101
        if max_len > self.max_context_len:
            raise ValueError(f"sequence of {max_len} tokens exceeds max_context_len={self.max_context_len}")
        if self.use_trtllm_decode:
            self._fill_block_tables(slots_np, bs)
            return
        self.cuda_graph_kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        self.cuda_graph_kv_indices[:nnz].copy_(self.kv_indices_cpu[:nnz], non_blocking=True)
        wrapper = self.graph_decode_wrappers[bs]
        self._plan_decode_all(wrapper, self.cuda_graph_kv_indices[:nnz], bs)
        # Padded rows contribute no pages to the attention output.
        self.cuda_graph_kv_indptr[raw_bs + 1 : bs + 1] = int(self.kv_indptr_np[raw_bs])  # expect: FC104
        self._plan_info["graph"] = (bs, nnz)

    # ------------------------------------------------------------------ attention

    def forward_extend(self, q, k, v, layer, fb: ForwardBatch) -> torch.Tensor:
        kv_cache = self.kv_pool.store(layer.layer_id, fb.out_cache_loc, k, v)
        q = q.view(-1, self.num_qo_heads, self.head_dim)
        if self.use_ragged:
            k = k.view(-1, self.num_kv_heads, self.head_dim)
            v = v.view(-1, self.num_kv_heads, self.head_dim)
            o = self.prefill_wrapper_ragged.run(q, k, v)
        else:
            o = self.prefill_wrapper_paged.run(q, kv_cache)
        return o.view(-1, self.num_qo_heads * self.head_dim)

    def forward_decode(self, q, k, v, layer, fb: ForwardBatch) -> torch.Tensor:
        kv_cache = self.kv_pool.store(layer.layer_id, fb.out_cache_loc, k, v)
        q = q.view(-1, self.num_qo_heads, self.head_dim)
        if self.use_trtllm_decode:
            o = trtllm_batch_decode_with_kv_cache(
                query=q,
                kv_cache=kv_cache,
                workspace_buffer=self.trtllm_workspace,
                block_tables=self.block_tables[: fb.batch_size],
                seq_lens=fb.seq_lens,
                max_seq_len=self.decode_max_seq_len,
                bmm1_scale=self.sm_scale,
                bmm2_scale=1.0,
                window_left=-1 if layer.sliding_window is None else layer.sliding_window - 1,
            )
        elif layer.sliding_window is not None:
            o = self.swa_decode_wrapper.run(q, kv_cache)  # expect: FC108
        else:
            wrapper = (
                self.graph_decode_wrappers[fb.batch_size] if fb.use_cuda_graph else self.decode_wrapper
            )
            o = wrapper.run(q, kv_cache)  # ok: FC108
        return o.view(-1, self.num_qo_heads * self.head_dim)

    # ------------------------------------------------------------------ reporting

    def workspace_usage(self) -> Dict[str, int]:
        usage = {
            "decode": self.decode_wrapper._float_workspace_buffer.numel(),  # expect: FC103
            "prefill": self.prefill_workspace.numel(),
        }
        if self.trtllm_workspace is not None:
            usage["trtllm"] = self.trtllm_workspace.numel()
        return usage

    def last_plans(self) -> Optional[Dict[str, Tuple[int, int]]]:
        return dict(self._plan_info) if self._plan_info else None
