"""FlashInfer attention backend.

The backend never holds the model runner, its buffers or its workspaces strongly: it reaches the
runner through ``self._runner_ref()`` and the graph buffers through ``self._bufs_ref()``. Plugins
(shared-prefix cascade, trtllm-gen decode) are attached the same way.
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Optional

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)

from wrl.batch import ForwardBatch
from wrl.kv_pool import fill_kv_indices
from wrl.wrapper_cache import GraphWrapperCache

if TYPE_CHECKING:
    from wrl.model_runner import ModelRunner
    from wrl_ext.prefix_share import SharedPrefixDecode
    from wrl_ext.trtllm_decode import TrtllmGenDecode

logger = logging.getLogger(__name__)


class DeadRunnerError(RuntimeError):
    pass


class FlashInferAttnBackend:
    def __init__(self, model_runner: "ModelRunner"):
        cfg = model_runner.cfg
        self.cfg = cfg
        self.device = model_runner.device
        self._runner_ref = weakref.ref(model_runner)
        self.swa_layers = frozenset(cfg.swa_layers)
        self.sm_scale = cfg.head_dim**-0.5
        self.q_dtype = getattr(torch, cfg.dtype)
        self._prefix_ref: Optional["weakref.ReferenceType[SharedPrefixDecode]"] = None
        self._trtllm_ref: Optional["weakref.ReferenceType[TrtllmGenDecode]"] = None
        self.rebind(model_runner)

    def rebind(self, model_runner: "ModelRunner") -> None:
        """Point the backend at the runner's (new) resources: at start-up and after wake_up()."""
        res = model_runner.resources
        self._bufs_ref = weakref.ref(res.graph_buffers)
        self.wrapper_cache = GraphWrapperCache(self.cfg, res.graph_buffers, res.arena)
        # eager wrappers: prefill, batches above the largest graph, sliding-window layers
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(res.arena.eager_workspace, "NHD")
        self.swa_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(res.arena.eager_workspace, "NHD")
        self.prefill_wrapper = BatchPrefillWithRaggedKVCacheWrapper(res.arena.prefill_workspace, "NHD")

    def release(self) -> None:
        """Drop the eager wrappers so that the workspaces they hold can be freed (sleep mode)."""
        self.decode_wrapper = None
        self.swa_decode_wrapper = None
        self.prefill_wrapper = None

    # ------------------------------------------------------------------ plugins

    def attach_prefix_sharing(self, prefix: "SharedPrefixDecode") -> None:
        self._prefix_ref = weakref.ref(prefix)

    def attach_trtllm(self, trtllm: "TrtllmGenDecode") -> None:
        self._trtllm_ref = weakref.ref(trtllm)

    def _runner(self):
        runner = self._runner_ref()
        assert runner is not None, "attention backend outlived its model runner"  # ok: FC109
        return runner

    # ------------------------------------------------------------------ eager metadata

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        runner = self._runner_ref()
        if runner is None:
            raise DeadRunnerError("model runner was collected before its attention backend")
        if fb.forward_mode.is_decode():
            self._plan_eager_decode(runner, fb.batch_size)
        else:
            self._plan_extend(runner, fb)

    def _plan_eager_decode(self, runner, bs: int) -> None:
        ib = runner.input_buffers
        ps = self.cfg.page_size
        pages_cpu = (ib.seq_lens_cpu[:bs] + ps - 1) // ps
        ib.kv_indptr_cpu[0] = 0
        torch.cumsum(pages_cpu, 0, dtype=torch.int32, out=ib.kv_indptr_cpu[1 : bs + 1])
        torch.remainder(ib.seq_lens_cpu[:bs] - 1, ps, out=ib.kv_last_page_len_cpu[:bs])
        ib.kv_last_page_len_cpu[:bs] += 1
        total_pages = int(ib.kv_indptr_cpu[bs])
        if total_pages > ib.kv_indices.numel():
            raise RuntimeError(f"{total_pages} pages exceed the eager page table ({ib.kv_indices.numel()})")
        ib.kv_indptr[: bs + 1].copy_(ib.kv_indptr_cpu[: bs + 1], non_blocking=True)
        ib.kv_last_page_len[:bs].copy_(ib.kv_last_page_len_cpu[:bs], non_blocking=True)

        max_len = int(ib.seq_lens_cpu[:bs].max())  # ok: FC101
        layout = runner._kv_layout  # ok: FC103
        self.decode_wrapper.plan(  # expect: FC102
            ib.kv_indptr[: bs + 1],
            ib.kv_indices,
            ib.kv_last_page_len[:bs],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            ps,
            q_data_type=self.q_dtype,
        )
        if self.swa_layers:
            window = self.cfg.sliding_window if max_len > self.cfg.sliding_window else -1
            self.swa_decode_wrapper.plan(  # ok: FC102
                ib.kv_indptr_cpu[: bs + 1],
                ib.kv_indices,
                ib.kv_last_page_len_cpu[:bs],
                self.cfg.num_qo_heads,
                self.cfg.num_kv_heads,
                self.cfg.head_dim,
                ps,
                window_left=window,
                q_data_type=self.q_dtype,
            )
        # the eager wrappers read the page table only in run(): fill it after planning
        fill_kv_indices(runner.kv_pool.req_to_page, ib.req_pool_indices, ib.kv_indptr, ib.kv_indices, bs)  # ok: FC104
        if self._prefix_ref is not None and (prefix := self._prefix_ref()) is not None:
            prefix.plan_step(bs)
        logger.debug("eager decode plan bs=%d pages=%d layout=%s", bs, total_pages, layout)

    def _plan_extend(self, runner, fb: ForwardBatch) -> None:
        ib = runner.input_buffers
        bs = fb.batch_size
        fb.max_extend_len = int((ib.qo_indptr[1 : bs + 1] - ib.qo_indptr[:bs]).max())  # expect: FC101
        self.prefill_wrapper.plan(  # expect: FC102
            ib.qo_indptr[: bs + 1],
            ib.qo_indptr_cpu[: bs + 1],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            causal=True,
            q_data_type=self.q_dtype,
        )

    # ------------------------------------------------------------------ graphs

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        bufs = self._bufs_ref()
        wrapper = self.wrapper_cache.build(bs)
        # dummy batch from GraphBufferPool.init_cuda_graph_state: one page of one token per request
        wrapper.plan(  # ok: FC102
            bufs.kv_indptr_cpu[: bs + 1],
            bufs.kv_indices[:bs],
            bufs.kv_last_page_len_cpu[:bs],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            q_data_type=self.q_dtype,
        )
        if self.swa_layers:
            self.swa_decode_wrapper.plan(
                bufs.kv_indptr_cpu[: bs + 1],
                bufs.kv_indices[:bs],
                bufs.kv_last_page_len_cpu[:bs],
                self.cfg.num_qo_heads,
                self.cfg.num_kv_heads,
                self.cfg.head_dim,
                self.cfg.page_size,
                window_left=self.cfg.sliding_window,
                q_data_type=self.q_dtype,
            )
        if self._prefix_ref is not None and (prefix := self._prefix_ref()) is not None:
            prefix.plan_step(bs)
        return wrapper

    def init_forward_metadata_replay_cuda_graph(self, bs: int, raw_bs: int, fb: ForwardBatch) -> None:
        runner = self._runner_ref()
        bufs = self._bufs_ref()
        if runner is None or bufs is None:
            raise DeadRunnerError("model runner or graph buffers released while graphs are still replayed")
        ib = runner.input_buffers
        ps = self.cfg.page_size
        logger.debug(f"replay bs={bs} raw_bs={raw_bs} seq_lens={fb.seq_lens[:raw_bs]}")  # expect: FC101

        # host mirrors first: page counts per request from the scheduler's lengths
        pages_cpu = (ib.seq_lens_cpu[:raw_bs] + ps - 1) // ps
        bufs.kv_indptr_cpu[0] = 0
        torch.cumsum(pages_cpu, 0, dtype=torch.int32, out=bufs.kv_indptr_cpu[1 : raw_bs + 1])
        # padded rows own no pages
        bufs.kv_indptr_cpu[raw_bs + 1 : bs + 1] = bufs.kv_indptr_cpu[raw_bs]
        torch.remainder(ib.seq_lens_cpu[:raw_bs] - 1, ps, out=bufs.kv_last_page_len_cpu[:raw_bs])
        bufs.kv_last_page_len_cpu[:raw_bs] += 1
        total_pages = int(bufs.kv_indptr_cpu[raw_bs])
        if total_pages > bufs.kv_indices.numel():
            # a context-length bump after a config reload: grow the page table in place
            bufs.kv_indices.resize_(total_pages * 2)  # expect: FC107

        # device page table, filled before plan() reads it
        bufs.kv_indptr[: bs + 1].copy_(bufs.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        fill_kv_indices(runner.kv_pool.req_to_page, ib.req_pool_indices, bufs.kv_indptr, bufs.kv_indices, raw_bs)  # ok: FC104

        wrapper = self.wrapper_cache.lookup(bs)
        wrapper.plan(  # ok: FC102
            bufs.kv_indptr_cpu[: bs + 1],
            bufs.kv_indices[:total_pages],
            bufs.kv_last_page_len_cpu[:bs],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            ps,
            q_data_type=self.q_dtype,
        )
        self.wrapper_cache.records[bs].remember(raw_bs, total_pages)
        bufs.last_bs = bs
        # dummy rows read one token of the dummy page
        bufs.kv_last_page_len[raw_bs:bs].fill_(1)  # expect: FC104
        bufs.kv_last_page_len_cpu[raw_bs:bs].fill_(1)  # ok: FC104

    # ------------------------------------------------------------------ forward

    def forward_decode(self, q, k, v, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        runner = self._runner()
        runner.kv_pool.store(layer_id, fb.out_cache_loc, k, v)
        kv_cache = runner.kv_pool.kv_buffer(layer_id)
        q = q.view(-1, self.cfg.num_qo_heads, self.cfg.head_dim)
        if layer_id in self.swa_layers:
            return self.swa_decode_wrapper.run(q, kv_cache)  # expect: FC108
        if self._prefix_ref is not None and (prefix := self._prefix_ref()) is not None:
            return prefix.attend(q, kv_cache)
        if self._trtllm_ref is not None and (trtllm := self._trtllm_ref()) is not None:
            return trtllm.decode(q, kv_cache, fb)
        wrapper = self.wrapper_cache.lookup(fb.batch_size) if fb.use_graph else self.decode_wrapper
        return wrapper.run(q, kv_cache)  # ok: FC108

    def forward_extend(self, q, k, v, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        runner = self._runner()
        runner.kv_pool.store(layer_id, fb.out_cache_loc, k, v)
        q = q.view(-1, self.cfg.num_qo_heads, self.cfg.head_dim)
        if self._trtllm_ref is not None and (trtllm := self._trtllm_ref()) is not None:
            return trtllm.context(q, runner.kv_pool.kv_buffer(layer_id), fb)
        k = k.view(-1, self.cfg.num_kv_heads, self.cfg.head_dim)
        v = v.view(-1, self.cfg.num_kv_heads, self.cfg.head_dim)
        return self.prefill_wrapper.run(q, k, v)  # ok: FC108
