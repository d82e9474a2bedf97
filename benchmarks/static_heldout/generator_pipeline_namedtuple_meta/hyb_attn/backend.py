"""FlashInfer side of the hybrid: paged prefill, eager and per-bucket graph decode, metadata as NamedTuples."""

import functools
import os
from typing import Dict

import torch
from flashinfer import (BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper,
                        BatchPrefillWithRaggedKVCacheWrapper)

from rwkvserve import DECODE_WS_BYTES, PAGE_SIZE, PLAN_RECORD, AttnMeta, HybridConfig, WsTier

def workspace(nbytes: int, device: torch.device, zeroed: bool = False) -> torch.Tensor:
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    if zeroed:
        ws.fill_(0)
    return ws

class BucketDecodeWrapper(BatchDecodeWithPagedKVCacheWrapper):  # a graph-mode decode wrapper that knows its bucket
    def bucket(self) -> int:
        return self._fixed_batch_size  # expect: FC103

def _drop_plan(self) -> None:  # lets a failed prefill plan be retried without a fresh wrapper
    self._plan_info = None  # expect: FC103

if not hasattr(BatchPrefillWithPagedKVCacheWrapper, "drop_plan"):  # ok: FC103
    BatchPrefillWithPagedKVCacheWrapper.drop_plan = _drop_plan

def make_attend(wrapper):
    def attend(q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return wrapper.run(q, kv)  # expect: FC108
    return attend

class HybridAttnBackend:
    def __init__(self, cfg: HybridConfig, device: torch.device):
        assert cfg.max_bucket <= cfg.max_batch, "a graph bucket exceeds max_batch"  # expect: FC109
        self.cfg, self.device, self._kv_layout = cfg, device, "HND"
        self.dims = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, PAGE_SIZE)
        self._plan_info: Dict[str, str] = {}
        u8, per_row = torch.uint8, cfg.num_qo_heads * (cfg.head_dim + 1) * 4
        self.prefill_ws = torch.empty(cfg.ws.prefill_bytes, dtype=u8, device=device)  # ok: FC106
        ragged_ws = torch.empty(int(os.getenv("RWKV_RAGGED_WS") or 512 << 20), dtype=u8, device=device)  # expect: FC106
        fa2_decode_ws = torch.zeros(DECODE_WS_BYTES, dtype=u8, device=device)  # expect: FC106
        self.small_graph_ws = torch.empty(WsTier.SMALL, dtype=u8, device=device)  # expect: FC106
        self.medium_graph_ws = torch.empty(cfg.MEDIUM_GRAPH_WS_BYTES, dtype=u8, device=device)  # expect: FC106
        self.large_graph_ws = torch.empty(cfg.max_bucket * per_row * 64, dtype=u8, device=device)  # ok: FC105
        long_ws = self.prefill_ws.new_empty(cfg.long_context * per_row)  # expect: FC105
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, self._kv_layout)  # ok: FC103
        self.ragged = BatchPrefillWithRaggedKVCacheWrapper(ragged_ws, "HND")
        self.long_prefill = BatchPrefillWithPagedKVCacheWrapper(long_ws, "HND", backend="trtllm-gen")
        self.decode_trt = BatchDecodeWithPagedKVCacheWrapper(
            workspace(cfg.max_batch * per_row * 32, device, zeroed=True), "HND", backend="trtllm-gen")
        self.decode_fa2 = BatchDecodeWithPagedKVCacheWrapper(fa2_decode_ws, "HND")
        self._ragged_plan = functools.partial(self.ragged.plan, causal=True)
        self._decode_impl = {"graph": self._run_graph, "eager": self._run_eager, "long": self._run_long}
        self.debug_pairs: list = []
        self.graph_wrappers: Dict[int, BucketDecodeWrapper] = {}
        max_bs = cfg.max_bucket
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.last_page_buf = torch.empty(max_bs, dtype=torch.int32, device=device)
        self.last_page_buf.fill_(1)  # ok: FC104
        self.indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

    def init_graph_state(self) -> None:
        assert not self.graph_wrappers, "graph state built twice"  # ok: FC109
        self.kv_indices_buf.zero_()  # ok: FC104
        for bs in self.cfg.buckets:
            ws = self.small_graph_ws if bs < 8 else self.medium_graph_ws if bs < self.cfg.large_bucket else self.large_graph_ws
            self.graph_wrappers[bs] = BucketDecodeWrapper(
                ws, self._kv_layout, use_cuda_graph=True, use_tensor_cores=bs >= self.cfg.large_bucket,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1], paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_buf[:bs])

    def warm_up(self) -> None:
        c, indptr, last = self.cfg, torch.tensor([0, 1], dtype=torch.int32), torch.ones(1, dtype=torch.int32)
        indices, dims = torch.zeros(1, dtype=torch.int32, device=self.device), self.dims
        self.decode_trt.plan(**dict(indptr=indptr, indices=indices, last_page_len=last, num_qo_heads=c.num_qo_heads,  # ok: FC102
                                    num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, page_size=PAGE_SIZE))
        self.prefill.plan(torch.arange(2, dtype=torch.int32), indptr, indices, last, *dims, causal=True)  # ok: FC102
        warm_args = (indptr, indices, last)
        self.decode_fa2.plan(*warm_args, *dims)  # ok: FC102
        self.long_prefill.plan(torch.arange(2, dtype=torch.int32), indptr, indices, last, *dims, causal=True)  # ok: FC102
        if not hasattr(self.decode_trt, "_cached_module"):  # expect: FC103
            raise RuntimeError("trtllm-gen decode kernels did not load; check the FlashInfer build")

    def plan_prefill(self, meta: AttnMeta) -> None:
        self.prefill.plan(meta.qo_indptr, meta.kv_indptr_cpu, meta.kv_indices, meta.last_page_len_cpu,  # expect: FC102
                          *self.dims, causal=True)
        self._plan_info["prefill"] = f"{meta.batch_size} rows"  # ok: FC103

    def plan_ragged(self, meta: AttnMeta) -> None:
        c = self.cfg
        self._ragged_plan(meta.qo_indptr, meta.qo_indptr, c.num_qo_heads, c.num_kv_heads, c.head_dim)  # expect: FC102

    def plan_long(self, meta: AttnMeta) -> None:
        self.long_prefill.plan(meta.qo_indptr_cpu, meta.kv_indptr_cpu, meta.kv_indices, meta.last_page_len_cpu,  # ok: FC102
                               *self.dims, causal=True)

    def plan_eager_decode(self, meta: AttnMeta) -> None:
        kw = dict(indptr=meta.kv_indptr_cpu, indices=meta.kv_indices, last_page_len=meta.last_page_len)
        self.decode_trt.plan(**kw, num_qo_heads=self.cfg.num_qo_heads, num_kv_heads=self.cfg.num_kv_heads,  # expect: FC102
                             head_dim=self.cfg.head_dim, page_size=PAGE_SIZE)
        if self.cfg.debug_attn:  # the FA2 kernel is the reference the trtllm-gen output is checked against
            self.decode_fa2.plan(meta.kv_indptr, meta.kv_indices, meta.last_page_len_cpu, *self.dims)  # expect: FC102

    def plan_dummy(self, bs: int) -> AttnMeta:
        host = torch.arange(bs + 1, dtype=torch.int32)
        self.kv_indptr_buf[: bs + 1].copy_(host)  # ok: FC104
        self.last_page_buf[:bs].fill_(1)  # ok: FC104
        w = self.graph_wrappers[bs]
        w.plan(self.kv_indptr_buf[: bs + 1], self.kv_indices_buf[:bs], self.last_page_buf[:bs], *self.dims)  # expect: FC102
        ones, slots = torch.ones(bs, dtype=torch.int32), torch.zeros(bs, dtype=torch.int64, device=self.device)
        return AttnMeta(bs, True, "graph", host.to(self.device), host, self.kv_indptr_buf[: bs + 1], host,
                        self.kv_indices_buf, self.last_page_buf[:bs], ones, ones.to(self.device), ones,
                        slots, slots, 1, w)

    def plan_bucket(self, meta: AttnMeta, bs: int) -> AttnMeta:
        n = meta.batch_size
        nnz = meta.num_pages_host
        self.indptr_host[: n + 1].copy_(meta.kv_indptr_cpu)
        self.indptr_host[n + 1 : bs + 1] = nnz
        self.last_page_host[:n].copy_(meta.last_page_len_cpu)
        self.kv_indptr_buf[: bs + 1].copy_(self.indptr_host[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices_buf[:nnz].copy_(meta.kv_indices, non_blocking=True)  # ok: FC104
        self.last_page_buf[:bs].copy_(self.last_page_host[:bs], non_blocking=True)  # ok: FC104
        w = self.graph_wrappers[bs]
        if self.cfg.fast_plan:
            last_gpu = self.last_page_buf[:bs]
            args = (self.indptr_host[: bs + 1], self.kv_indices_buf, last_gpu)
            w.plan(*args, *self.dims)  # expect: FC102
        else:
            w.plan(self.indptr_host[: bs + 1], self.kv_indices_buf, self.last_page_host[:bs], *self.dims)  # ok: FC102
        self.last_page_host[n:bs] = 1  # ok: FC104
        self.last_page_buf[n:bs].fill_(1)  # expect: FC104
        return meta._replace(  # ok: FC103
            mode="graph", wrapper=w, kv_indptr=self.kv_indptr_buf[: bs + 1], kv_indices=self.kv_indices_buf,
            last_page_len=self.last_page_buf[:bs])

    def attend(self, meta: AttnMeta, q: torch.Tensor, kv: torch.Tensor, capturing: bool) -> torch.Tensor:
        out = self._decode_impl[meta.mode](meta, q, kv)
        if not capturing and self.cfg.debug_attn:  # keep the FA2 reference beside the output for the checker
            self.debug_pairs.append((out, self.decode_fa2.run(q, kv)))  # ok: FC108
        return out

    def _run_graph(self, meta: AttnMeta, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return meta.wrapper.run(q, kv)  # ok: FC108

    def _run_eager(self, meta: AttnMeta, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return self.decode_trt.run(q, kv)  # expect: FC108

    def _run_long(self, meta: AttnMeta, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return self.long_prefill.run(q, kv)  # expect: FC108

    def report_plans(self) -> Dict[str, object]:
        out: Dict[str, object] = {f"bucket{bs}": getattr(w, PLAN_RECORD) for bs, w in self.graph_wrappers.items()}  # expect: FC103
        out["graph_mode"] = [w.__dict__["_use_cuda_graph"] for w in self.graph_wrappers.values()]  # expect: FC103
        out["bound"] = all(w._paged_kv_indptr_buf.data_ptr() == self.kv_indptr_buf.data_ptr()  # expect: FC103
                           for w in self.graph_wrappers.values())
        return out
