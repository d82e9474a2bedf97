"""FlashInfer attention over pooled buffers: eager decode, sliding-window and ragged wrappers, a pool of spare decode
wrappers for shared-prefix groups, and graph-mode decode wrappers per bucket bound to buffers from the tensor pool."""

from __future__ import annotations

import collections
import functools
import operator
import weakref
from typing import Deque, Dict

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper, merge_state

from attn.trtllm import TrtllmGenDecode
from poolserve.config import DRAFT_EXTEND_WORKSPACE_BYTES, GRAPH_BUCKETS, GROUP_WORKSPACE_BYTES, WS_MIB, ServeConfig
from poolserve.metadata import BucketRecord, ForwardBatch, MetadataPool, StepMetadata
from poolserve.pools import Lease, StagingRing, TensorPool

U8 = torch.uint8


class WrapperPool:
    def __init__(self, n: int, device: torch.device):
        assert n > 0, "a wrapper pool needs at least one wrapper"  # expect: FC109
        self._idle: Deque[BatchDecodeWithPagedKVCacheWrapper] = collections.deque()
        for _ in range(n):
            ws = torch.empty(GROUP_WORKSPACE_BYTES, dtype=U8, device=device)  # expect: FC106
            self._idle.append(BatchDecodeWithPagedKVCacheWrapper(ws, "NHD"))

    def acquire(self) -> BatchDecodeWithPagedKVCacheWrapper:
        warm = [w for w in self._idle if getattr(w, "_cached_module", None) is not None]  # expect: FC103
        w = warm[0] if warm else self._idle[0]  # prefer one whose kernels are already loaded
        self._idle.remove(w)
        return w

    def release(self, w: BatchDecodeWithPagedKVCacheWrapper) -> None:
        w._plan_info = None  # expect: FC103
        self._idle.append(w)

    def shrink(self, keep: int) -> int:
        return sum(self._idle.pop()._float_workspace_buffer.numel() for _ in range(len(self._idle) - keep))  # expect: FC103


class FlashInferBackend:
    GRAPH_WORKSPACE_BYTES = 256 * 1024 * 1024

    def __init__(self, cfg: ServeConfig, device: torch.device):
        assert GRAPH_BUCKETS == tuple(sorted(GRAPH_BUCKETS))  # ok: FC109
        self.cfg, self.device, self._kv_layout = cfg, device, "NHD"  # ok: FC103
        self.pool = TensorPool(device)
        self.meta_pool = MetadataPool(cfg.max_batch_size, device)
        self.staging = StagingRing(cfg.staging_depth, cfg.max_batch_size, device)
        self.wrapper_pool = WrapperPool(cfg.group_wrappers, device)
        decode_ws = torch.empty(cfg.split_kv_workspace_bytes(), dtype=U8, device=device)  # ok: FC106
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(decode_ws, self._kv_layout)
        self.swa_wrapper = BatchDecodeWithPagedKVCacheWrapper(torch.zeros(WS_MIB["swa"] << 20, dtype=U8, device=device), "NHD")  # expect: FC106
        self._plan_swa = functools.partial(self.swa_wrapper.plan, window_left=cfg.sliding_window - 1)
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(torch.empty(cfg.prefill_workspace_bytes, dtype=U8, device=device), "NHD")  # ok: FC106
        draft_extend_ws = torch.empty(DRAFT_EXTEND_WORKSPACE_BYTES, dtype=U8, device=device)  # expect: FC106
        self.draft_extend_wrapper = BatchPrefillWithRaggedKVCacheWrapper(draft_extend_ws, self._kv_layout)
        self.bucket_workspace = torch.empty(self.GRAPH_WORKSPACE_BYTES, dtype=U8, device=device)  # expect: FC106
        self.records: Dict[int, BucketRecord] = {}
        self.trtllm = TrtllmGenDecode(cfg, self.pool, device)

    def init_graph_state(self) -> None:
        for bs in self.cfg.graph_buckets:
            rec = self.records[bs] = BucketRecord(bs, self.pool)
            rec.kv_indptr = self.pool.acquire(bs + 1)[: bs + 1]
            rec.kv_indices = self.pool.acquire(self.cfg.max_pages)
            rec.kv_last_page_len = self.pool.acquire(bs)[:bs]
            rec.kv_last_page_len.fill_(1)  # ok: FC104
            rec.wrapper = BatchDecodeWithPagedKVCacheWrapper(
                self.bucket_workspace, self._kv_layout, use_cuda_graph=True, paged_kv_indptr_buffer=rec.kv_indptr,
                paged_kv_indices_buffer=rec.kv_indices, paged_kv_last_page_len_buffer=rec.kv_last_page_len)
        self.trtllm.init_wrappers()

    def init_forward_metadata(self, batch: ForwardBatch) -> StepMetadata:
        meta = self.meta_pool.acquire().reset(batch, self.decode_wrapper, self.cfg.max_batch_size)
        return self._init_decode(batch, meta) if batch.is_decode else self._init_extend(batch, meta)

    def _init_decode(self, batch: ForwardBatch, meta: StepMetadata) -> StepMetadata:
        bs, dims = batch.batch_size, self.cfg.plan_dims()
        indptr = self.pool.acquire(bs + 1)[: bs + 1]
        indptr.copy_(batch.kv_indptr_cpu, non_blocking=True)
        lease = Lease(self.pool, self.pool.acquire(batch.kv_indptr[-1]))  # the scheduler recycles its indices
        meta.kv_indices = lease.tensor[: batch.kv_indices.numel()].copy_(batch.kv_indices)  # ok: FC101
        meta.kv_indptr, meta.kv_last_page_len, meta.leases = indptr, batch.kv_last_page_len, [lease]
        self.decode_wrapper.plan(indptr, meta.kv_indices, batch.kv_last_page_len_cpu, *dims)  # expect: FC102
        if self.cfg.decode_backend == "trtllm-gen":
            self.trtllm.plan_eager(batch)
        if self.cfg.swa_every and torch.any(batch.seq_lens > self.cfg.sliding_window):  # expect: FC101
            slot = self.staging.next()
            slot.indptr_cpu[: bs + 1].copy_(batch.kv_indptr_cpu)  # ok: FC101
            self._plan_swa(slot.upload(bs + 1), meta.kv_indices, batch.kv_last_page_len_cpu, *dims)  # expect: FC102
        if batch.prefix_indptr_cpu is not None:
            meta.prefix_wrapper = self.wrapper_pool.acquire()
            meta.prefix_wrapper.plan(batch.prefix_indptr_cpu, batch.prefix_indices, batch.prefix_last_page_len, *dims)  # expect: FC102
            weakref.finalize(batch, self.wrapper_pool.release, meta.prefix_wrapper)
        return meta

    def _init_extend(self, batch: ForwardBatch, meta: StepMetadata) -> StepMetadata:
        meta.qo_indptr = batch.qo_indptr.clone()  # ok: FC107
        meta.max_seq_len = max(batch.extend_lens.tolist())  # expect: FC101
        self.ragged_wrapper.plan(batch.qo_indptr, batch.qo_indptr, *self.cfg.plan_dims()[:3], causal=True)  # expect: FC102
        return meta

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> StepMetadata:
        assert bs in self.records, f"bucket {bs} has no pooled buffers"  # expect: FC109
        rec = self.records[bs]
        rec.kv_indptr.copy_(torch.arange(bs + 1, dtype=torch.int32, device=self.device))  # ok: FC104
        rec.wrapper.plan(rec.kv_indptr, rec.kv_indices, rec.kv_last_page_len, *self.cfg.plan_dims())  # expect: FC102
        meta = rec.meta = self.meta_pool.acquire()
        meta.wrapper, meta.bucket, meta.seq_lens = rec.wrapper, bs, torch.ones(bs, dtype=torch.int32, device=self.device)
        meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len = rec.kv_indptr, rec.kv_indices, rec.kv_last_page_len
        meta.prefix_wrapper = self.wrapper_pool.acquire()  # every bucket can replay a shared-prefix batch
        return meta

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: ForwardBatch) -> StepMetadata:
        rec, raw_bs = self.records[bs], batch.batch_size
        n = int(batch.kv_indptr_cpu[raw_bs])  # ok: FC101
        if n > rec.kv_indices.numel():
            rec.kv_indices = torch.empty(2 * n, dtype=torch.int32, device=self.device)  # expect: FC107
        slot = self.staging.next()
        slot.indptr_cpu[: raw_bs + 1] = batch.kv_indptr_cpu
        slot.indptr_cpu[raw_bs + 1 : bs + 1] = n
        slot.last_page_len_cpu[:raw_bs] = batch.kv_last_page_len_cpu
        slot.last_page_len_cpu[raw_bs:bs] = 1
        rec.kv_indptr.copy_(slot.upload(bs + 1))  # ok: FC104
        rec.kv_indices[:n].copy_(batch.kv_indices[:n], non_blocking=True)  # ok: FC104
        rec.kv_last_page_len[:raw_bs].copy_(batch.kv_last_page_len, non_blocking=True)  # ok: FC104
        rec.wrapper.plan(slot.indptr_cpu[: bs + 1], rec.kv_indices, slot.last_page_len_cpu[:bs], *self.cfg.plan_dims())  # ok: FC102
        rec.kv_last_page_len[raw_bs:].fill_(1)  # expect: FC104
        meta = rec.meta.reset(batch, rec.wrapper, bs)
        meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len = rec.kv_indptr, rec.kv_indices, rec.kv_last_page_len
        return meta

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: StepMetadata, layer: int) -> torch.Tensor:
        if self.cfg.is_swa_layer(layer):
            return self.swa_wrapper.run(q, kv_cache)  # expect: FC108
        o, lse = meta.wrapper.run_return_lse(q, kv_cache)  # ok: FC108
        if meta.prefix_wrapper is None:
            return o
        o_prefix, lse_prefix = meta.prefix_wrapper.run_return_lse(q, kv_cache)  # expect: FC108
        return merge_state(o, lse, o_prefix, lse_prefix)[0]

    def debug_state(self) -> dict:
        wrappers = [r.wrapper for r in self.records.values()]
        bound = list(map(operator.attrgetter("_paged_kv_indptr_buf"), wrappers))  # expect: FC103
        modes = [w.is_cuda_graph_enabled for w in wrappers]  # ok: FC103
        pages = {bs: r.kv_indptr[-1].item() for bs, r in self.records.items()}  # ok: FC101
        fixed = {bs: w._fixed_batch_size for bs, w in self.trtllm.graph_wrappers.items()}  # expect: FC103
        int_ws = {bs: vars(w)["_int_workspace_buffer"].numel() for bs, w in self.trtllm.graph_wrappers.items()}  # expect: FC103
        return {"bound_indptr": bound, "graph_mode": modes, "pages": pages, "trtllm": (fixed, int_ws)}
