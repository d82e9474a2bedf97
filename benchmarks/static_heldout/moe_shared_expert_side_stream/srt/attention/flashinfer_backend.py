"""FlashInfer backend: eager decode / extend wrappers, one graph-mode decode wrapper per captured batch size,
a shared system-prompt wrapper merged by LSE and a trtllm-gen decode for long contexts."""

from __future__ import annotations

import logging
from typing import Dict, Optional

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    merge_state,
)
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from sidemoe.batch import ForwardBatch
from sidemoe.config import ServeConfig, default_prefill_workspace_bytes
from sidemoe.kv_pool import PagedKVPool
from srt.attention.workspace import get_trtllm_workspace

logger = logging.getLogger(__name__)


class SideMoEFlashInferBackend:
    def __init__(self, cfg: ServeConfig, device: torch.device, kv_pool: PagedKVPool):
        self.cfg = cfg
        self.device = device
        self.kv_pool = kv_pool
        self.decode_workspace = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.prefill_workspace = torch.zeros(default_prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC106
        self.trtllm_workspace = get_trtllm_workspace(cfg.trtllm_workspace_bytes(), device.index or 0)
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, "NHD")
        self.sys_prefix_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, "NHD")
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, "NHD")
        self.paged_prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD")
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.graph_bs: Optional[int] = None
        self.has_sys_prefix = cfg.sys_prompt_pages > 0
        self.use_trtllm_long = False
        self.max_seq_len = 0
        self.sys_indptr_cpu = torch.zeros(cfg.max_running_requests + 1, dtype=torch.int32, pin_memory=True)
        self.sys_indices_cpu = torch.arange(max(cfg.sys_prompt_pages, 1), dtype=torch.int32).pin_memory()
        self.sys_last_cpu = torch.full((cfg.max_running_requests,), cfg.page_size, dtype=torch.int32, pin_memory=True)

    # ---------------------------------------------------------------- per-step (eager) metadata
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        self.graph_bs = None
        if fb.forward_mode.is_decode():
            self._init_decode(fb)
        else:
            self._init_extend(fb)

    def _init_decode(self, fb: ForwardBatch) -> None:
        self.max_seq_len = int(fb.seq_lens_cpu.max())  # ok: FC101
        self.use_trtllm_long = bool((fb.seq_lens >= self.cfg.trtllm_context_threshold).any())  # expect: FC101
        if not self.use_trtllm_long:
            self._plan_decode(fb)

    def _plan_decode(self, fb: ForwardBatch) -> None:
        cfg = self.cfg
        bs = fb.batch_size
        self.decode_wrapper.plan(  # expect: FC102
            fb.kv_indptr_cpu,
            fb.kv_indices,
            fb.kv_last_page_len,
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            data_type=torch.bfloat16,
        )
        if self.has_sys_prefix:
            self.sys_indptr_cpu[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32) * cfg.sys_prompt_pages
            self.sys_prefix_wrapper.plan(  # ok: FC102
                self.sys_indptr_cpu[: bs + 1],
                self.sys_indices_cpu.repeat(bs),
                self.sys_last_cpu[:bs],
                cfg.num_qo_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                cfg.page_size,
                data_type=torch.bfloat16,
            )

    def _init_extend(self, fb: ForwardBatch) -> None:
        cfg = self.cfg
        bs = fb.batch_size
        qo_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(fb.extend_lens, 0, out=qo_indptr[1:])
        self.ragged_wrapper.plan(  # expect: FC102
            qo_indptr, qo_indptr, cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, causal=True
        )
        qo_indptr_host = torch.from_numpy(np.concatenate(([0], np.cumsum(fb.extend_lens_cpu))).astype(np.int32))
        self.paged_prefill_wrapper.plan(  # ok: FC102
            qo_indptr_host,
            fb.kv_indptr_cpu,
            fb.kv_indices,
            torch.from_numpy(fb.last_page_len_np),
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            causal=False,
        )

    # ---------------------------------------------------------------- CUDA graphs
    def init_cuda_graph_state(self, max_bs: int) -> None:
        cfg = self.cfg
        self.cuda_graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.cuda_graph_kv_indices = torch.zeros(max_bs * cfg.max_pages_per_req, dtype=torch.int32, device=self.device)
        self.cuda_graph_last_page_len = torch.empty(max_bs, dtype=torch.int32, device=self.device)
        self.cuda_graph_last_page_len.fill_(1)  # ok: FC104
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_workspace = torch.zeros(cfg.graph_workspace_bytes(), dtype=torch.uint8, device=self.device)  # ok: FC106

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        indptr = self.cuda_graph_kv_indptr[: bs + 1]
        torch.arange(0, bs + 1, dtype=torch.int32, device=self.device, out=indptr)  # ok: FC104
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace,
            "NHD",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=indptr,
            paged_kv_indices_buffer=self.cuda_graph_kv_indices,
            paged_kv_last_page_len_buffer=self.cuda_graph_last_page_len[:bs],
        )
        self.kv_indptr_cpu[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self._plan_graph(w, bs, self.cuda_graph_kv_indices[:bs])
        self.graph_wrappers[bs] = w
        self.graph_bs = bs

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        n = fb.batch_size
        self.kv_indptr_cpu[: n + 1].copy_(fb.kv_indptr_cpu)
        self.kv_indptr_cpu[n + 1 : bs + 1] = fb.kv_indptr_cpu[-1]
        self.last_page_len_cpu[:n].copy_(torch.from_numpy(fb.last_page_len_np))
        num_pages = int(fb.kv_indptr_cpu[-1])
        self.cuda_graph_kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        self._plan_graph(self.graph_wrappers[bs], bs, fb.kv_indices)
        self.cuda_graph_kv_indices[num_pages:].fill_(0)  # expect: FC104
        self.graph_bs = bs

    def _plan_graph(self, w: BatchDecodeWithPagedKVCacheWrapper, bs: int, indices: torch.Tensor) -> None:
        cfg = self.cfg
        w.plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1],
            indices,
            self.last_page_len_cpu[:bs],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            data_type=torch.bfloat16,
        )

    # ---------------------------------------------------------------- attention
    def forward_decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                       fb: ForwardBatch) -> torch.Tensor:
        self.kv_pool.set_kv(layer_id, fb.out_cache_loc, k, v)
        kv = self.kv_pool.kv_buffer(layer_id)
        if self.use_trtllm_long and self.graph_bs is None:
            return self._decode_trtllm(q, kv, fb)
        w = self.decode_wrapper if self.graph_bs is None else self.graph_wrappers[self.graph_bs]
        o, lse = w.run_return_lse(q, kv)  # ok: FC108
        if self.has_sys_prefix:
            o_p, lse_p = self.sys_prefix_wrapper.run_return_lse(q, self.kv_pool.prefix_buffer(layer_id))  # expect: FC108
            o, lse = merge_state(o, lse, o_p, lse_p)
        return o

    def _decode_trtllm(self, q: torch.Tensor, kv: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        if self.decode_wrapper._kv_layout == "NHD":  # expect: FC103
            kv = kv.transpose(2, 3).contiguous()
        return trtllm_batch_decode_with_kv_cache(
            query=q,
            kv_cache=kv,
            workspace_buffer=self.trtllm_workspace,
            block_tables=fb.block_tables,
            seq_lens=fb.seq_lens,
            max_seq_len=self.max_seq_len,
            bmm1_scale=self.cfg.head_dim ** -0.5,
            bmm2_scale=1.0,
        )

    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                       fb: ForwardBatch) -> torch.Tensor:
        self.kv_pool.set_kv(layer_id, fb.out_cache_loc, k, v)
        o_new, lse_new = self.ragged_wrapper.run_return_lse(q, k, v)
        o_pre, lse_pre = self.paged_prefill_wrapper.run_return_lse(q, self.kv_pool.kv_buffer(layer_id))
        o, _ = merge_state(o_new, lse_new, o_pre, lse_pre)
        return o
