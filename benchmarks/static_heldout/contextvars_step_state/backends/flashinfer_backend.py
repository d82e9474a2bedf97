"""FlashInfer backend: eager wrappers for the step, graph-mode decode wrappers per bucket.

Plan helpers take no batch argument: they read the batch and the metadata back from the step context.
"""
import contextvars
import logging
import math
import os
from typing import Dict

import torch
from flashinfer import (BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper,
                        BatchPrefillWithRaggedKVCacheWrapper)
from flashinfer.cascade import merge_state

from backends.trtllm_gen import TrtllmGenDecode
from ctxserve.config import PREFIX_WS_BYTES, ServeConfig
from ctxserve.context import CURRENT_META, current_batch, current_meta, host_staging
from ctxserve.metadata import ForwardMetadata

logger = logging.getLogger(__name__)

class FlashInferAttnBackend:
    WINDOW_WS_BYTES = 96 * 1024 * 1024
    def __init__(self, cfg: ServeConfig, device: torch.device):
        self.cfg, self.device, self._kv_layout = cfg, device, "NHD"
        max_bs, u8, i32 = cfg.max_running_requests, torch.uint8, torch.int32
        self.workspace = torch.empty(cfg.decode_workspace_bytes(), dtype=u8, device=device)  # ok: FC106
        self.prefill_workspace = torch.empty(cfg.prefill_workspace_bytes, dtype=u8, device=device)  # ok: FC105
        self.window_workspace = torch.zeros(self.WINDOW_WS_BYTES, dtype=u8, device=device)  # expect: FC106
        self.prefix_workspace = torch.zeros(PREFIX_WS_BYTES, dtype=u8, device=device)  # expect: FC106
        self.ragged_workspace = torch.zeros(int(os.getenv("CTX_RAGGED_WS_MB", "64")) << 20, dtype=u8, device=device)  # expect: FC106
        self.chunk_workspace = torch.zeros(int(os.environ["CTX_CHUNK_WS_BYTES"]), dtype=u8, device=device)  # ok: FC106
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=i32, device=device)
        self.kv_indices = torch.zeros(cfg.num_pages, dtype=i32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=i32, device=device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=i32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=i32, pin_memory=True)
        self.chunk_indptr = torch.zeros(max_bs + 1, dtype=i32, device=device)
        self.prefix_pages = torch.arange(cfg.system_prompt_len // cfg.page_size, dtype=i32, device=device)
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.workspace, self._kv_layout)  # ok: FC103
        self.window_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.window_workspace, "NHD")
        self.chunk_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.chunk_workspace, "NHD")
        self.prefix_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefix_workspace, "NHD")
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD")
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.ragged_workspace, "NHD")
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.trtllm = TrtllmGenDecode(cfg, device)
    def heads(self) -> dict:
        c = self.cfg
        return dict(num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, page_size=c.page_size)
    def init_cuda_graph_state(self, buckets):
        self.kv_indices.zero_()  # ok: FC104
        for bs in buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, self._kv_layout, use_cuda_graph=True, paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices, paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs])
        self.trtllm.init_cuda_graph_state(buckets)
    def init_forward_metadata(self) -> contextvars.Token:
        """Plans the eager wrappers for the batch in context and publishes CURRENT_META; the caller resets it."""
        batch = current_batch()
        token = CURRENT_META.set(ForwardMetadata(self.decode_wrapper, self.window_wrapper, self.prefix_wrapper,
                                                 batch.kv_indptr, batch.kv_last_page_len, batch.seq_lens,
                                                 self.cfg.system_prompt_len))
        if batch.is_decode:
            self.plan_decode()
        else:
            self.plan_extend()
        return token
    def plan_decode(self):
        batch, c = current_batch(), self.cfg
        if int(batch.seq_lens.max()) > c.context_len:  # expect: FC101
            raise ValueError(f"sequence beyond context_len={c.context_len}: {batch.seq_lens}")  # ok: FC101
        self.decode_wrapper.plan(batch.kv_indptr, batch.kv_indices, batch.kv_last_page_len_cpu, **self.heads())  # expect: FC102
        self.plan_window()
        self.plan_chunk()
        self.plan_shared_prefix()
        self.trtllm.prepare_raw()
    def plan_window(self):
        batch, meta = current_batch(), current_meta()
        self.window_wrapper.plan(batch.kv_indptr_cpu, batch.kv_indices, meta.kv_last_page_len,  # expect: FC102
                                 window_left=self.cfg.sliding_window - 1, **self.heads())
    def plan_chunk(self):
        """Chunked local attention: each row sees at most the pages of its current chunk."""
        batch, c = current_batch(), self.cfg
        bs, chunk_pages = batch.batch_size, math.ceil(c.chunk_size / c.page_size)  # ok: FC101
        if self.chunk_indptr.numel() < bs + 1:
            self.chunk_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)  # expect: FC107
        pages = (batch.kv_indptr[1:] - batch.kv_indptr[:-1]).clamp(max=chunk_pages)
        torch.cumsum(pages, 0, dtype=torch.int32, out=self.chunk_indptr[1 : bs + 1])  # ok: FC104
        plan = self.chunk_wrapper.plan
        plan(self.chunk_indptr[: bs + 1], batch.kv_indices, batch.kv_last_page_len_cpu, **self.heads())  # expect: FC102
    def plan_shared_prefix(self):
        """Cascade level 0: every row also attends the shared system-prompt pages."""
        bs, c = current_batch().batch_size, self.cfg
        n = c.system_prompt_len // c.page_size
        if getattr(self, "prefix_indices", None) is None:
            self.prefix_indices = torch.cat([self.prefix_pages] * c.max_running_requests)  # ok: FC107
        qo_cpu = torch.arange(bs + 1, dtype=torch.int32)
        self.prefix_wrapper.plan(qo_cpu, qo_cpu * n, self.prefix_indices[: bs * n],  # ok: FC102
                                 torch.full((bs,), c.page_size, dtype=torch.int32), c.num_qo_heads, c.num_kv_heads,
                                 c.head_dim, c.page_size, causal=False)
    def plan_extend(self):
        batch, meta, c = current_batch(), current_meta(), self.cfg
        meta.use_ragged = bool((batch.prefix_lens == 0).all())  # expect: FC101
        self.ragged_wrapper.plan(batch.qo_indptr_cpu, batch.qo_indptr_cpu, c.num_qo_heads, c.num_kv_heads, c.head_dim, causal=True)  # ok: FC102
        if not meta.use_ragged:  # ok: FC101
            cached_rows = (batch.prefix_lens > 0).nonzero().squeeze(1)  # expect: FC101
            logger.debug("prefix-cache hits on rows %s", cached_rows)  # ok: FC101
            self.prefill_wrapper.plan(batch.qo_indptr, batch.kv_indptr_cpu, batch.kv_indices, batch.kv_last_page_len_cpu,  # expect: FC102
                                      c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size, causal=False)
        # rows that finish their prompt decode next step: seed the decode indptr with their page counts
        pages = (batch.seq_lens + c.page_size - 1) // c.page_size
        torch.cumsum(pages, 0, dtype=torch.int32, out=self.kv_indptr[1 : batch.batch_size + 1])  # expect: FC104
    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> ForwardMetadata:
        assert bs <= self.cfg.max_running_requests, f"bucket {bs} above max_running_requests"  # expect: FC109
        self.kv_indptr[: bs + 1].copy_(torch.arange(bs + 1, dtype=torch.int32, device=self.device))  # ok: FC104
        w = self.graph_wrappers[bs]
        w.plan(self.kv_indptr[: bs + 1], self.kv_indices[:bs], self.kv_last_page_len_cpu[:bs], **self.heads())  # expect: FC102
        self.kv_last_page_len[:bs].fill_(1)  # expect: FC104
        meta = ForwardMetadata(w, self.window_wrapper, self.prefix_wrapper, self.kv_indptr[: bs + 1],
                               self.kv_last_page_len[:bs], current_batch().seq_lens, self.cfg.system_prompt_len)
        logger.info(f"bucket {bs}: decode plan captured over kv_indptr={meta.kv_indptr}")  # expect: FC101
        return meta
    def init_forward_metadata_replay_cuda_graph(self, bs: int):
        batch, meta = current_batch(), current_meta()
        staged, raw_bs = host_staging(), batch.batch_size
        if "seq_lens_dev" in staged and torch.equal(staged["seq_lens_dev"], batch.seq_lens):  # expect: FC101
            return  # same lengths as this thread's previous replay: the plan still holds
        staged["seq_lens_dev"] = batch.seq_lens
        self.kv_indptr_cpu[: raw_bs + 1].copy_(batch.kv_indptr_cpu)  # ok: FC104
        self.kv_indptr_cpu[raw_bs + 1 : bs + 1] = batch.kv_indptr_cpu[raw_bs]
        self.kv_last_page_len_cpu[:raw_bs].copy_(batch.kv_last_page_len_cpu)
        num_pages = int(batch.kv_indptr_cpu[raw_bs])  # ok: FC101
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:num_pages].copy_(batch.kv_indices[:num_pages], non_blocking=True)  # ok: FC104
        meta.decode_wrapper.plan(self.kv_indptr_cpu[: bs + 1], self.kv_indices[:num_pages],  # ok: FC102
                                 self.kv_last_page_len_cpu[:bs], **self.heads())
        self.plan_window()
        self.plan_chunk()
        self.plan_shared_prefix()
        self.trtllm.plan_bucket(bs)
        meta.kv_last_page_len[raw_bs:bs].fill_(1)  # expect: FC104
    def forward_extend(self, q, k, v, kv_cache) -> torch.Tensor:
        o, lse = self.ragged_wrapper.run_return_lse(q, k, v)  # ok: FC108
        if current_meta().use_ragged:  # ok: FC101
            return o
        o_prefix, lse_prefix = self.prefill_wrapper.run_return_lse(q, kv_cache)  # ok: FC108
        return merge_state(o, lse, o_prefix, lse_prefix)[0]
    def dump_plan_state(self) -> dict:
        """/debug/attn endpoint; never on the step."""
        meta = current_meta()
        return {"plan_info": meta.decode_wrapper._plan_info,  # expect: FC103
                "kv_indptr": meta.decode_wrapper._paged_kv_indptr_buf,  # expect: FC103
                "seq_lens": meta.seq_lens.tolist()}  # ok: FC101
