"""FlashInfer backend: eager wrappers for the step, graph-mode decode wrappers per bucket."""
import functools
from typing import Dict

import torch
from flashinfer import (BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper,
                        BatchPrefillWithRaggedKVCacheWrapper)
from flashinfer.cascade import merge_state

from dwserve.batch import ForwardBatch, ForwardMode
from dwserve.config import PREFILL_WORKSPACE_BYTES, ServeConfig, window_workspace_bytes
from dwserve.decorators import check_batch, skip_unchanged_plan, traced


def pad_after_plan(fn):
    """Marks the padded rows of a bucket as one-token sequences once the bucket is planned."""
    @functools.wraps(fn)
    def padded(self: "FlashInferBackend", bs: int, batch: ForwardBatch):
        out = fn(self, bs, batch)
        if batch.batch_size < bs:
            self.kv_last_page_len[batch.batch_size : bs].fill_(1)  # expect: FC104
        return out
    return padded


class FlashInferBackend:
    SOFTCAP_WS_BYTES = 48 * 1024 * 1024
    def __init__(self, cfg: ServeConfig, device: torch.device):
        self.cfg, self.device, self._kv_layout = cfg, device, "NHD"
        max_bs, u8, i32 = cfg.max_batch_size, torch.uint8, torch.int32
        self.workspace = torch.empty(cfg.split_kv_workspace_bytes(), dtype=u8, device=device)  # ok: FC106
        self.local_workspace = torch.empty(cfg.split_kv_workspace_bytes() // 2, dtype=u8, device=device)  # ok: FC105
        self.prefill_workspace = torch.zeros(PREFILL_WORKSPACE_BYTES, dtype=u8, device=device)  # expect: FC106
        self.window_workspace = torch.zeros(window_workspace_bytes(), dtype=u8, device=device)  # expect: FC106
        self.softcap_workspace = torch.zeros(self.SOFTCAP_WS_BYTES, dtype=u8, device=device)  # expect: FC106
        self.extend_workspace = torch.empty(cfg.extend_workspace_bytes, dtype=u8, device=device)  # ok: FC106
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=i32, device=device)
        self.kv_indices = torch.zeros(cfg.max_total_pages, dtype=i32, device=device)
        self.kv_last_page_len = torch.empty(max_bs, dtype=i32, device=device)
        self.kv_last_page_len.fill_(1)  # ok: FC104
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=i32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=i32, pin_memory=True)
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.workspace, self._kv_layout)  # ok: FC103
        self.window_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.window_workspace, "NHD")
        self.softcap_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.softcap_workspace, "NHD")
        self.local_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.local_workspace, "NHD")
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD")
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.extend_workspace, "NHD")
        self.plan_ragged = functools.partial(self.ragged_wrapper.plan, causal=True)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.plan_signatures: Dict[int, tuple] = {}
        self.extend_has_prefix = False
    def heads(self) -> dict:
        c = self.cfg
        return dict(num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
                    page_size=c.page_size, data_type=torch.bfloat16)
    def init_graph_wrappers(self, buckets):
        self.kv_indptr.zero_()  # ok: FC104
        for bs in buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, self._kv_layout, use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1], paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs])
    @traced("metadata")
    @check_batch
    def init_forward_metadata(self, batch: ForwardBatch):
        if batch.mode is ForwardMode.DECODE:
            self.plan_decode(batch)
        else:
            self.plan_extend(batch)
    @traced("plan")
    def plan_decode(self, batch: ForwardBatch):
        c = self.cfg
        if (batch.kv_last_page_len > c.page_size).any():  # expect: FC101
            raise ValueError(f"last_page_len above page size {c.page_size}: {batch.kv_last_page_len}")  # ok: FC101
        self.decode_wrapper.plan(batch.kv_indptr, batch.kv_indices, batch.kv_last_page_len_cpu, **self.heads())  # expect: FC102
        self.window_wrapper.plan(  # ok: FC102
            batch.kv_indptr_cpu, batch.kv_indices, batch.kv_last_page_len_cpu, window_left=c.sliding_window - 1, **self.heads())
        self.local_wrapper.plan(  # ok: FC102
            batch.kv_indptr_cpu, batch.kv_indices, batch.kv_last_page_len_cpu, window_left=c.local_chunk - 1, **self.heads())
        signature = (batch.batch_size, tuple(batch.seq_lens_cpu.tolist()))  # ok: FC101
        self._plan_softcap(self.softcap_wrapper, signature, batch)
    @skip_unchanged_plan
    def _plan_softcap(self, wrapper, signature, batch: ForwardBatch):
        wrapper.plan(  # expect: FC102
            batch.kv_indptr_cpu, batch.kv_indices, batch.kv_last_page_len, logits_soft_cap=30.0, **self.heads())
    @traced("plan")
    def plan_extend(self, batch: ForwardBatch):
        """Ragged attention over the new tokens, paged attention over the cached prefix."""
        c = self.cfg
        has_prefix = bool(batch.extend_prefix_lens.any())  # expect: FC101
        self.plan_ragged(batch.qo_indptr_cpu, batch.qo_indptr_cpu, c.num_qo_heads, c.num_kv_heads, c.head_dim)  # ok: FC102
        if has_prefix:  # in extend mode the batch's page table covers the cached prefix only
            self.prefill_wrapper.plan(  # expect: FC102
                batch.qo_indptr, batch.kv_indptr_cpu, batch.kv_indices, batch.kv_last_page_len_cpu,
                c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size, causal=False)
        self.extend_has_prefix = has_prefix
    @pad_after_plan
    def plan_bucket(self, bs: int, batch: ForwardBatch):
        self._check_bucket(bs)
        raw_bs = batch.batch_size
        self.kv_indptr_cpu[: raw_bs + 1].copy_(batch.kv_indptr_cpu)  # ok: FC104
        self.kv_indptr_cpu[raw_bs + 1 : bs + 1] = batch.kv_indptr_cpu[raw_bs]
        self.kv_last_page_len_cpu[:raw_bs].copy_(batch.kv_last_page_len_cpu)
        num_pages = int(batch.kv_indptr_cpu[raw_bs])  # ok: FC101
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:num_pages].copy_(batch.kv_indices[:num_pages])  # ok: FC104
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1], self.kv_indices[:num_pages], self.kv_last_page_len_cpu[:bs], **self.heads())
    def _check_bucket(self, bs: int):
        assert bs in self.graph_wrappers, f"bucket {bs} was never captured"  # expect: FC109
    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, kind: str) -> torch.Tensor:
        if kind == "window":
            return self.window_wrapper.run(q, kv_cache)  # expect: FC108
        if kind == "softcap":
            return self.softcap_wrapper.run(q, kv_cache)  # expect: FC108
        if kind == "local":
            return self.local_wrapper.run(q, kv_cache)  # expect: FC108
        w = self.graph_wrappers[q.shape[0]] if q.shape[0] in self.graph_wrappers else self.decode_wrapper
        return w.run(q, kv_cache)  # ok: FC108
    def forward_extend(self, q, k, v, kv_cache) -> torch.Tensor:
        o, lse = self.ragged_wrapper.run_return_lse(q, k, v)  # ok: FC108
        if not self.extend_has_prefix:
            return o
        o_prefix, lse_prefix = self.prefill_wrapper.run_return_lse(q, kv_cache)  # ok: FC108
        return merge_state(o, lse, o_prefix, lse_prefix)[0]
