"""FlashInfer attention with tracing hooks: decode graphs per bucket, a paged prefill, a shadow decode."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict, Optional

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    trtllm_batch_decode_with_kv_cache,
)

from tracing import SamplingProfiler
from tr_attn.config import TraceEngineConfig
from tr_attn.workspace import make_workspace_pool


@dataclass
class DecodeMeta:
    kv_indptr: torch.Tensor
    kv_last_page_len: torch.Tensor
    batch_size: int


@dataclass
class PrefillBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    qo_indptr_gpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_cpu: torch.Tensor
    num_tokens: int


class TracedAttnBackend:
    def __init__(self, cfg: TraceEngineConfig, device: torch.device, profiler: SamplingProfiler):
        self.cfg = cfg
        self.device = device
        self.profiler = profiler
        self.pool = make_workspace_pool(cfg, device)
        max_bs = cfg.largest_bucket
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.last_page_buf = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.block_tables = torch.zeros(cfg.max_running, cfg.max_pages_per_seq, dtype=torch.int32, device=device)
        self.graph_decode: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {
            bs: BatchDecodeWithPagedKVCacheWrapper(
                self.pool.decode_workspace,
                "HND",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_buf[:bs],
            )
            for bs in cfg.buckets
        }
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.pool.eager_workspace, "HND")
        # reference decode the tracer compares the graph's output against
        self.shadow_decode = BatchDecodeWithPagedKVCacheWrapper(self.pool.eager_workspace, "HND")
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.pool.prefill_workspace, "HND")
        self._prefill_plan = functools.partial(self.prefill_wrapper.plan, causal=True)
        self.active = self.eager_decode
        self.num_pages_used = 0
        self.shadow_out: Optional[torch.Tensor] = None

    @property
    def heads(self) -> tuple:
        return (self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.page_size)

    def plan_prefill(self, batch: PrefillBatch) -> None:
        self._prefill_plan(batch.qo_indptr_gpu, batch.kv_indptr_cpu, batch.kv_indices, batch.last_page_cpu, *self.heads)  # expect: FC102

    def plan_eager(self, kv_indptr_cpu: torch.Tensor, kv_indices: torch.Tensor, last_page_cpu: torch.Tensor) -> None:
        self.eager_decode.plan(kv_indptr_cpu, kv_indices, last_page_cpu, *self.heads)
        if self.cfg.shadow_attention:
            self.shadow_decode.plan(kv_indptr_cpu, kv_indices, last_page_cpu, *self.heads)
        self.active = self.eager_decode

    def plan_bucket(self, bs: int) -> None:
        w = self.graph_decode[bs]
        w.plan(self.kv_indptr_host[: bs + 1], self.kv_indices_buf, self.last_page_host[:bs], *self.heads)  # ok: FC102
        if self.cfg.shadow_attention:
            self.shadow_decode.plan(self.kv_indptr_host[: bs + 1], self.kv_indices_buf, self.last_page_host[:bs],
                                    *self.heads)
        self.profiler.record_plan(w, bs)
        self.active = w

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        self.kv_indptr_host[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.last_page_host[:bs] = 1
        self.plan_bucket(bs)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, real_bs: int, kv_indptr_cpu: torch.Tensor,
                                                kv_indices: torch.Tensor, last_page_cpu: torch.Tensor) -> DecodeMeta:
        n = int(kv_indptr_cpu[real_bs])
        self.kv_indices_buf[:n].copy_(kv_indices[:n], non_blocking=True)  # ok: FC104
        self.kv_indptr_host[: real_bs + 1].copy_(kv_indptr_cpu[: real_bs + 1])
        self.kv_indptr_host[real_bs + 1 : bs + 1] = n
        self.last_page_host[:real_bs].copy_(last_page_cpu[:real_bs])
        self.last_page_host[real_bs:bs] = 1
        md = DecodeMeta(kv_indptr=self.kv_indptr_buf[: bs + 1], kv_last_page_len=self.last_page_buf[:bs],
                        batch_size=real_bs)
        self.plan_bucket(bs)
        # padding rows end where the last real row ends, for the KV-append kernel
        md.kv_indptr[real_bs + 1 :] = n  # expect: FC104
        self.num_pages_used = n
        return md

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        with self.profiler.kernel("decode_attn"):
            out = self.active.run(q, kv_cache)  # ok: FC108
        if self.cfg.shadow_attention:
            self.shadow_out = self.shadow_decode.run(q, kv_cache)  # expect: FC108
        return out

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        with self.profiler.kernel("prefill_attn"):
            return self.prefill_wrapper.run(q, kv_cache)

    def forward_long(self, q: torch.Tensor, kv_cache: torch.Tensor, seq_lens: torch.Tensor,
                     max_seq_len: int) -> torch.Tensor:
        return trtllm_batch_decode_with_kv_cache(
            q, kv_cache, self.pool.trt_workspace, self.block_tables[: q.shape[0]], seq_lens, max_seq_len
        )
