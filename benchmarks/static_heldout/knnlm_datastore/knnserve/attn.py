"""FlashInfer attention for the kNN-LM: graph-mode decode per bucket, a retrieval-key head, prefill,
and trtllm-gen decode for batches larger than the biggest bucket."""
from __future__ import annotations

import bisect
from typing import List, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from knnserve.batch import DecodeRequestBatch, KnnAttnMetadata, PrefillMetadata
from knnserve.settings import DECODE_WS_MB, KnnServeSettings


class KnnAttnBackend:
    def __init__(self, settings: KnnServeSettings, device: torch.device):
        self.settings = settings
        self.device = device
        s = settings
        max_bs = max(s.buckets)
        max_nnz = s.max_batch * s.max_pages_per_req
        self.graph_workspace = torch.zeros(DECODE_WS_MB << 20, dtype=torch.uint8, device=device)  # expect: FC106
        self.prefill_workspace = torch.empty(s.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.trtllm_workspace = torch.empty(s.trtllm_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.eager_workspace = torch.zeros(s.eager_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106

        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_nnz, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(s.max_batch, dtype=torch.int32, device=device)
        self.kv_indptr_pinned = torch.zeros(s.max_batch + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_pinned = torch.ones(s.max_batch, dtype=torch.int32, pin_memory=True)

        self.buckets = sorted(s.buckets)
        self.graph_wrappers: List[BatchDecodeWithPagedKVCacheWrapper] = [
            BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace, "NHD", use_cuda_graph=True, use_tensor_cores=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
                backend="fa2",
            )
            for bs in self.buckets
        ]
        # the retrieval-key head: a narrow attention over the last layer's cache whose output is the kNN query
        self.key_attn = BatchDecodeWithPagedKVCacheWrapper(self.eager_workspace, "NHD", use_tensor_cores=True)
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD", backend="fa2")
        self.active_idx = 0
        self.overflow: Optional[KnnAttnMetadata] = None
        self.kv_caches: List[torch.Tensor] = []

    def workspace_usage(self) -> dict:
        return {
            "graph": self.graph_workspace.numel(),
            "prefill_float": self.prefill_wrapper._float_workspace_buffer.numel(),  # expect: FC103
            "eager": self.eager_workspace.numel(),
        }

    def bucket_for(self, bs: int) -> Optional[int]:
        i = bisect.bisect_left(self.buckets, bs)
        return self.buckets[i] if i < len(self.buckets) else None

    # ---------------------------------------------------------------- host metadata
    def build_metadata(self, batch: DecodeRequestBatch) -> KnnAttnMetadata:
        bs = batch.bs
        bucket = self.bucket_for(bs) or bs
        counts = np.fromiter((len(p) for p in batch.page_lists), dtype=np.int32, count=bs)
        indptr = self.kv_indptr_pinned.numpy()
        indptr[0] = 0
        np.cumsum(counts, out=indptr[1 : bs + 1])
        indptr[bs + 1 : bucket + 1] = indptr[bs]
        nnz = int(indptr[bs])
        last = self.last_page_pinned.numpy()
        last[:bs] = batch.last_page_lens
        last[bs:bucket] = 1
        flat = torch.from_numpy(np.concatenate(batch.page_lists).astype(np.int32))
        seq_np = (counts - 1) * self.settings.page_size + batch.last_page_lens
        tables = np.zeros((bs, self.settings.max_pages_per_req), dtype=np.int32)
        for i, p in enumerate(batch.page_lists):
            tables[i, : len(p)] = p
        return KnnAttnMetadata(
            bs=bs,
            bucket=bucket,
            nnz=nnz,
            kv_indptr_cpu=self.kv_indptr_pinned[: bucket + 1],
            kv_last_page_len_cpu=self.last_page_pinned[:bucket],
            kv_indices=flat.to(self.device, non_blocking=True),
            seq_lens=torch.from_numpy(seq_np.astype(np.int32)).to(self.device, non_blocking=True),
            block_tables=torch.from_numpy(tables).to(self.device, non_blocking=True),
        )

    def build_prefill_metadata(self, prompts: List[np.ndarray], page_lists: List[np.ndarray],
                               last_page_lens: np.ndarray) -> PrefillMetadata:
        n = len(prompts)
        qo = np.zeros(n + 1, dtype=np.int32)
        np.cumsum([len(p) for p in prompts], out=qo[1:])
        kv = np.zeros(n + 1, dtype=np.int32)
        np.cumsum([len(p) for p in page_lists], out=kv[1:])
        return PrefillMetadata(
            num_reqs=n,
            qo_indptr=torch.from_numpy(qo).to(self.device, non_blocking=True),
            kv_indptr_cpu=torch.from_numpy(kv),
            kv_indices=torch.from_numpy(np.concatenate(page_lists).astype(np.int32)).to(self.device),
            kv_last_page_len_cpu=torch.from_numpy(last_page_lens.astype(np.int32)),
        )

    # ---------------------------------------------------------------- planning
    def refresh_graph_inputs(self, meta: KnnAttnMetadata) -> None:
        bucket = meta.bucket
        self.active_idx = self.buckets.index(bucket)
        if meta.nnz > self.kv_indices.numel():
            self.kv_indices = torch.zeros(meta.nnz + self.settings.page_headroom, dtype=torch.int32, device=self.device)  # expect: FC107
        self.kv_indptr[: bucket + 1].copy_(meta.kv_indptr_cpu, non_blocking=True)  # ok: FC104
        self.kv_indices[: meta.nnz].copy_(meta.kv_indices, non_blocking=True)
        self.graph_wrappers[self.active_idx].plan(  # ok: FC102
            meta.kv_indptr_cpu, meta.kv_indices, meta.kv_last_page_len_cpu,
            self.settings.num_qo_heads, self.settings.num_kv_heads, self.settings.head_dim, self.settings.page_size,
            q_data_type=torch.bfloat16,
        )
        self.seq_lens[: meta.bs].copy_(meta.seq_lens, non_blocking=True)  # ok: FC104
        self.kv_last_page_len[meta.bs : bucket].fill_(1)  # expect: FC104

    def plan_key_head(self, meta: KnnAttnMetadata) -> None:
        s = self.settings
        self.key_attn.plan(meta.kv_indptr_cpu, meta.kv_indices, meta.kv_last_page_len_cpu,  # ok: FC102
                           s.num_qo_heads // 4, s.num_kv_heads, s.head_dim, s.page_size, q_data_type=torch.bfloat16)

    def plan_prefill(self, meta: PrefillMetadata) -> None:
        s = self.settings
        self.prefill_wrapper.plan(meta.qo_indptr, meta.kv_indptr_cpu, meta.kv_indices, meta.kv_last_page_len_cpu,  # expect: FC102
                                  s.num_qo_heads, s.num_kv_heads, s.head_dim, s.page_size, causal=True,
                                  q_data_type=torch.bfloat16)

    # ---------------------------------------------------------------- forward
    def forward_decode(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        kv = self.kv_caches[layer_id]
        if self.overflow is not None:
            m = self.overflow
            return trtllm_batch_decode_with_kv_cache(
                q, kv, self.trtllm_workspace, m.block_tables, m.seq_lens, self.settings.max_context,
                bmm1_scale=self.settings.head_dim ** -0.5, bmm2_scale=1.0,
            )
        return self.graph_wrappers[self.active_idx].run(q, kv)  # ok: FC108

    def forward_key_head(self, q: torch.Tensor) -> torch.Tensor:
        return self.key_attn.run(q, self.kv_caches[-1])  # expect: FC108

    def forward_prefill(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        return self.prefill_wrapper.run(q, self.kv_caches[layer_id])
