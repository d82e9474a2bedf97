"""FlashInfer attention backend of the target model (SGLang-shaped).

Eager decode, sliding-window decode, target-verify (paged prefill) and ragged extend
wrappers, plus one graph-mode decode wrapper per captured batch size. Wrappers and
workspaces come from the cached factories in `resources` or from cached properties;
the eager plan variants are `functools.partialmethod`s of one plan helper.
"""
from __future__ import annotations

import functools
import logging

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)

from lrc_kernels.pages import fill_kv_indices, page_math
from lrc_kernels.trtllm_path import TrtllmDecodePath

from . import envs
from .config import EngineConfig
from .decorators import pad_graph_rows
from .forward_batch import ForwardBatch
from .model import LlamaAttention, PagedKVPool
from .resources import (
    eager_decode_wrapper,
    fa2_scratch,
    graph_workspace,
    pinned_bucket,
    window_decode_wrapper,
)

logger = logging.getLogger(__name__)


class FlashInferDecodeBackend:
    def __init__(self, cfg: EngineConfig, req_to_page: torch.Tensor, kv_pool: PagedKVPool, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.req_to_page = req_to_page  # [max_running_requests, max_pages_per_seq] int32, device
        self.kv_pool = kv_pool
        self._kv_layout = "NHD"  # ok: FC103
        max_bs = cfg.max_batch_size
        # eager page table: device copies for the kernels, pinned mirrors for plan()
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(cfg.num_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.qo_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.qo_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.decode_wrapper = eager_decode_wrapper(device, self._kv_layout)
        self.trtllm = TrtllmDecodePath(cfg, device) if cfg.trtllm_min_seq_len > 0 else None
        self._verify_plan_defaults = dict(
            num_qo_heads=cfg.num_qo_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim_qk=cfg.head_dim,
            page_size=cfg.page_size,
            causal=True,
            q_data_type=cfg.dtype,
            kv_data_type=cfg.dtype,
        )
        # what this backend last planned on each eager wrapper (id -> key): identical
        # consecutive decode steps skip plan()
        self._plan_info: dict[int, tuple] = {}
        # graph-mode page table, allocated by init_cuda_graph_state()
        self.g_kv_indptr = None
        self.g_kv_indices = None
        self.g_last_page_len = None

    # ---------------------------------------------------------------- cached wrappers

    @functools.cached_property
    def window_wrapper(self) -> BatchDecodeWithPagedKVCacheWrapper:
        return window_decode_wrapper(self.device, self.cfg.sliding_window, self.cfg.workspace_bytes)

    @functools.cached_property
    def verify_wrapper(self) -> BatchPrefillWithPagedKVCacheWrapper:
        """Paged prefill over num_draft_tokens + 1 query tokens per row (FA2)."""
        cfg = self.cfg
        rows = cfg.max_batch_size * (cfg.num_draft_tokens + 1)
        nbytes = rows * cfg.num_qo_heads * cfg.max_kv_splits * (cfg.head_dim * 4 + 8)
        return BatchPrefillWithPagedKVCacheWrapper(fa2_scratch(nbytes, self.device), self._kv_layout, backend="fa2")

    @functools.cached_property
    def prefill_wrapper(self) -> BatchPrefillWithRaggedKVCacheWrapper:
        """Ragged prefill over the new tokens of extend batches."""
        workspace = torch.zeros(envs.PREFILL_WORKSPACE_MB << 20, dtype=torch.uint8, device=self.device)  # expect: FC106
        return BatchPrefillWithRaggedKVCacheWrapper(workspace, self._kv_layout, backend="fa2")

    # ---------------------------------------------------------------- graph state

    def init_cuda_graph_state(self, max_bs: int) -> None:
        self.g_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.g_kv_indices = torch.zeros(self.cfg.num_pages, dtype=torch.int32, device=self.device)
        self.g_last_page_len = torch.empty(max_bs, dtype=torch.int32, device=self.device)
        self.g_last_page_len.fill_(1)  # ok: FC104
        # wrappers bound to the previous buffers must not be handed out again
        type(self).graph_wrapper.cache_clear()

    @functools.lru_cache(maxsize=None)
    def graph_wrapper(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        """Graph-mode decode wrapper of one bucket, bound to views of the graph page table."""
        self.g_last_page_len[:bs].fill_(1)  # ok: FC104
        return BatchDecodeWithPagedKVCacheWrapper(
            graph_workspace(self.device),
            self._kv_layout,
            use_cuda_graph=True,
            use_tensor_cores=True,
            paged_kv_indptr_buffer=self.g_kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.g_kv_indices,
            paged_kv_last_page_len_buffer=self.g_last_page_len[:bs],
        )

    # ---------------------------------------------------------------- plan helpers

    def _already_planned(self, wrapper, key) -> bool:
        # FlashInfer leaves its plan state unset until a wrapper's first plan()
        if wrapper._plan_info is None:  # expect: FC103
            return False
        return self._plan_info.get(id(wrapper)) == key  # ok: FC103

    def _plan_decode_into(self, wrapper, indptr, indices, last_page_len, *, key=None, window_left=-1) -> None:
        if key is not None and self._already_planned(wrapper, key):
            return
        wrapper.plan(  # ok: FC102
            indptr,
            indices,
            last_page_len,
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            window_left=window_left,
            q_data_type=self.cfg.dtype,
            kv_data_type=self.cfg.dtype,
        )
        if key is not None:
            self._plan_info[id(wrapper)] = key

    plan_full = functools.partialmethod(_plan_decode_into, window_left=-1)
    plan_window = functools.partialmethod(_plan_decode_into, window_left=envs.SLIDING_WINDOW - 1)

    def _plan_graph(self, bs: int, indptr_host: torch.Tensor, last_page_len_host: torch.Tensor) -> None:
        self.graph_wrapper(bs).plan(  # ok: FC102
            indptr_host,
            self.g_kv_indices,
            last_page_len_host,
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            q_data_type=self.cfg.dtype,
            kv_data_type=self.cfg.dtype,
        )

    def _plan_verify(self, bs: int, qo_indptr_cpu: torch.Tensor, kv_indptr_cpu: torch.Tensor) -> None:
        kw = dict(self._verify_plan_defaults)
        kw.setdefault("qo_indptr", qo_indptr_cpu)
        kw.setdefault("paged_kv_indptr", kv_indptr_cpu)
        kw.setdefault("paged_kv_indices", self.kv_indices)
        kw.setdefault("paged_kv_last_page_len", self.kv_last_page_len[:bs])
        self.verify_wrapper.plan(**kw)  # expect: FC102

    def _plan_extend(self, fb: ForwardBatch) -> None:
        ext_np = fb.extend_seq_lens_cpu.numpy()
        qo_np = np.zeros(fb.batch_size + 1, dtype=np.int32)
        np.cumsum(ext_np, out=qo_np[1:])
        qo_indptr_host = torch.from_numpy(qo_np)
        self.prefill_wrapper.plan(  # ok: FC102
            qo_indptr_host,
            qo_indptr_host,
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            causal=True,
            q_data_type=self.cfg.dtype,
        )

    def _long_rows(self, fb: ForwardBatch) -> bool:
        return fb.max_seq_len_host > self.cfg.trtllm_min_seq_len

    # ---------------------------------------------------------------- per-step metadata

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        pages_np, last_np = page_math(fb.seq_lens_cpu.numpy(), self.cfg.page_size)
        self.kv_indptr_cpu[0] = 0
        np.cumsum(pages_np, out=self.kv_indptr_cpu[1 : bs + 1].numpy())
        self.kv_last_page_len_cpu[:bs].copy_(torch.from_numpy(last_np))
        total = int(self.kv_indptr_cpu[bs])
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)
        self.kv_last_page_len[:bs].copy_(self.kv_last_page_len_cpu[:bs], non_blocking=True)
        fill_kv_indices(self.req_to_page, fb.req_pool_indices, self.kv_indptr[: bs + 1], self.kv_indices, total)

        mode = fb.forward_mode
        if mode.is_extend():
            self._plan_extend(fb)
        elif mode.is_target_verify():
            tpr = fb.tokens_per_req
            self.qo_indptr_cpu[: bs + 1].copy_(torch.arange(0, (bs + 1) * tpr, tpr, dtype=torch.int32))
            self._plan_verify(bs, self.qo_indptr_cpu[: bs + 1], self.kv_indptr_cpu[: bs + 1])
            self.qo_indptr[: bs + 1].copy_(self.qo_indptr_cpu[: bs + 1], non_blocking=True)
        else:
            key = (bs, pages_np.tobytes(), last_np.tobytes())
            wrapper = self.decode_wrapper
            if self.trtllm is not None and not self.cfg.trtllm_raw_kernel:
                wrapper = self.trtllm.wrapper_for(bs, self.cfg.dtype, self._long_rows(fb))
            self.plan_full(wrapper, self.kv_indptr_cpu[: bs + 1], self.kv_indices, self.kv_last_page_len_cpu[:bs], key=key)
            if self.cfg.window_layers:
                self.plan_window(
                    self.window_wrapper, self.kv_indptr_cpu[: bs + 1], self.kv_indices, self.kv_last_page_len_cpu[:bs]
                )

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        if fb.forward_mode.is_target_verify():
            # verify is planned like an eager step over the eager page table
            self.init_forward_metadata(fb)
            return
        host = pinned_bucket(bs, self.cfg.num_pages, "target")
        host.kv_indptr.copy_(torch.arange(bs + 1, dtype=torch.int32))
        host.last_page_len.fill_(1)
        self.g_kv_indptr[: bs + 1].copy_(host.kv_indptr, non_blocking=True)
        self._plan_graph(bs, host.kv_indptr, host.last_page_len)

    @pad_graph_rows
    def init_forward_metadata_replay_cuda_graph(self, bs: int, raw_bs: int, fb: ForwardBatch) -> None:
        if fb.forward_mode.is_target_verify():
            self.init_forward_metadata(fb)
            return
        host = pinned_bucket(bs, self.cfg.num_pages, "target")
        pages_np, last_np = page_math(fb.seq_lens_cpu.numpy(), self.cfg.page_size)
        host.kv_indptr[0] = 0
        np.cumsum(pages_np, out=host.kv_indptr[1 : raw_bs + 1].numpy())
        # padded rows own no pages
        host.kv_indptr[raw_bs + 1 :] = host.kv_indptr[raw_bs]
        host.last_page_len[:raw_bs].copy_(torch.from_numpy(last_np))
        host.last_page_len[raw_bs:] = 0
        total = int(host.kv_indptr[raw_bs])
        self.g_kv_indptr[: bs + 1].copy_(host.kv_indptr, non_blocking=True)  # ok: FC104
        fill_kv_indices(self.req_to_page, fb.req_pool_indices, self.g_kv_indptr[: raw_bs + 1], self.g_kv_indices, total)
        self._plan_graph(bs, host.kv_indptr, host.last_page_len)

    # ---------------------------------------------------------------- forward

    def forward(self, q, k, v, layer: LlamaAttention, fb: ForwardBatch) -> torch.Tensor:
        self.kv_pool.write(layer.layer_id, fb.out_cache_loc, k, v)
        kv_cache = self.kv_pool.layer(layer.layer_id)
        if fb.forward_mode.is_decode():
            return self.forward_decode(q, kv_cache, layer, fb)
        if fb.forward_mode.is_target_verify():
            return self.forward_verify(q, kv_cache, fb)
        if not fb.use_graph:
            return self.forward_extend(q, k, v, kv_cache, fb)
        raise RuntimeError(f"{fb.forward_mode.name} batches are never captured")

    def forward_decode(self, q, kv_cache, layer: LlamaAttention, fb: ForwardBatch) -> torch.Tensor:
        if layer.sliding_window:
            return self.window_wrapper.run(q, kv_cache)  # expect: FC108
        if self.trtllm is not None and not fb.use_graph:
            if self.cfg.trtllm_raw_kernel:
                return self.trtllm.decode_raw(q, kv_cache, fb, self.req_to_page)
            return self.trtllm.wrapper_for(fb.batch_size, self.cfg.dtype, self._long_rows(fb)).run(q, kv_cache)  # ok: FC108
        w = self.graph_wrapper(fb.batch_size) if fb.use_graph else self.decode_wrapper
        return w.run(q, kv_cache)  # ok: FC108

    def forward_verify(self, q, kv_cache, fb: ForwardBatch) -> torch.Tensor:
        return self.verify_wrapper.run(q, kv_cache)  # expect: FC108

    def forward_extend(self, q, k, v, kv_cache, fb: ForwardBatch) -> torch.Tensor:
        if self.trtllm is not None and self._long_rows(fb):
            return self.trtllm.context(q, kv_cache, fb, self.req_to_page)
        return self.prefill_wrapper.run(q, k, v)  # ok: FC108
