import os

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper

from evalserve.requests import EvalLimits, ScoreBatch

WS_MIB = int(os.environ.get("EVAL_WS_MIB", "256"))
_WS_FIELDS = ("_int_workspace_buffer", "_float_workspace_buffer")


class EvalAttention:
    def __init__(self, limits: EvalLimits, device):
        self.limits = limits
        self.device = device
        self._sm_scale = limits.head_dim ** -0.5
        self.ragged_ws = torch.zeros(WS_MIB << 20, dtype=torch.uint8, device=device)  # expect: FC106
        self.score_ws = torch.zeros(limits.score_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.decode_ws = torch.empty(limits.max_tokens * limits.num_heads * limits.head_dim * 4, dtype=torch.uint8, device=device)  # ok: FC105
        max_bs = max(limits.buckets)
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(limits.max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.ragged = BatchPrefillWithRaggedKVCacheWrapper(self.ragged_ws, "NHD")
        self.window_decode = BatchDecodeWithPagedKVCacheWrapper(self.score_ws, "NHD")
        self.graph_decode = {}
        for bs in limits.buckets:
            self.graph_decode[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.decode_ws,
                "NHD",
                use_cuda_graph=True,
                backend="fa2",
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )

    def plan_ragged(self, batch: ScoreBatch):
        lim = self.limits
        self.ragged.plan(  # expect: FC102
            batch.cu_seqlens,
            batch.cu_seqlens,
            lim.num_heads,
            lim.num_kv_heads,
            lim.head_dim,
            causal=True,
            sm_scale=self._sm_scale,  # ok: FC103
        )

    def prepare_decode(self, bs: int, indptr_cpu, indices, last_len_cpu):
        if bs > self.kv_last_page_len.numel():
            self.kv_last_page_len = torch.ones(bs, dtype=torch.int32, device=self.device)  # expect: FC107
        n = int(indptr_cpu[bs])
        self.kv_indptr[: bs + 1].copy_(indptr_cpu, non_blocking=True)  # ok: FC104
        self.kv_indices[:n].copy_(indices, non_blocking=True)  # ok: FC104
        self.kv_last_page_len[:bs].copy_(last_len_cpu, non_blocking=True)
        self.graph_decode[bs].plan(  # ok: FC102
            indptr_cpu,
            indices,
            last_len_cpu,
            self.limits.num_heads,
            self.limits.num_kv_heads,
            self.limits.head_dim,
            self.limits.page_size,
        )

    def workspace_report(self):
        total = 0
        for name in _WS_FIELDS:
            total += getattr(self.ragged, name).numel()  # expect: FC103
        return total

    def decode(self, q, kv_cache, bs: int, windowed: bool):
        if windowed:
            return self.window_decode.run(q, kv_cache)  # expect: FC108
        return self.graph_decode[bs].run(q, kv_cache)  # ok: FC108

    def ragged_forward(self, q, k, v):
        return self.ragged.run(q, k, v)
